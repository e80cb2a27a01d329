"""Servers that misbehave on purpose, run for real (Debian's nginx, not as root), against the commands that talk
to them: a registry whose error bodies echo the request's headers must not get the login printed back."""

from __future__ import annotations

import base64

import pytest

from tests.conftest import json_error, run_cli
from tests.e2e.serving_tools import NGINX, nginx_site, tool_missing

pytestmark = [pytest.mark.nginx, pytest.mark.publish, pytest.mark.e2e,
              pytest.mark.skipif(tool_missing(NGINX), reason="Debian nginx is not installed (make test installs it)")]

USER, PASSWORD = "alice", "s3cr3t-pw-0123"

#: a registry that asks for HTTP basic auth (as distribution's htpasswd does) and answers every request, the one
#: with the login included, 401 with a body that echoes the Authorization header it got (a proxy or a debug build)
ECHO_REGISTRY = r"""
server {
    listen {listen};
    location /v2/ {
        add_header WWW-Authenticate 'Basic realm="echo"' always;
        add_header Docker-Distribution-API-Version registry/2.0 always;
        default_type application/json;
        return 401 '{"errors":[{"code":"UNAUTHORIZED","message":"denied; you sent Authorization: $http_authorization"}]}';
    }
}
"""


def test_a_registry_that_echoes_the_login_does_not_get_it_printed(tmp_path):
    """`pull` from it fails (exit 2, the registry refused) and neither the password nor its Basic credential
    (base64 of user:password) is on stdout or stderr, with or without --json; the message says [redacted]."""
    credential = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    env = {"MODELYARD_REGISTRY_USER": USER, "MODELYARD_REGISTRY_PASSWORD": PASSWORD}
    with nginx_site(ECHO_REGISTRY, probe="/v2/") as base:
        ref = f"oci://{base.removeprefix('http://')}/models/tiny:v1"
        r = run_cli("pull", ref, "--into", str(tmp_path / "x"), "--json", env=env)
        err = json_error(r.stdout, "pull", 2)
        assert err["message"] == (f"{ref}: the registry refused to serve the manifest: HTTP 401 "
                                  "(UNAUTHORIZED: denied; you sent Authorization: [redacted])")
        plain = run_cli("pull", ref, "--into", str(tmp_path / "y"), env=env)
        assert plain.returncode == 2 and "[redacted]" in plain.stderr
        for out in (r.stdout, r.stderr, plain.stdout, plain.stderr):
            assert PASSWORD not in out and credential not in out
