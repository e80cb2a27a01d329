"""LoRA adapter artifacts: a real peft adapter on the tiny Llama is judged against its base artifact;
twins with one defect each (rank above --max-lora-rank, another hidden size, a module vLLM does not apply
LoRA to, no base) give exactly that finding code. The adapter ingest stores ``kind: lora`` with the base
by digest and a serve/vllm.yaml that loads it with --enable-lora."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from modelyard.artifact.manifest import Manifest
from modelyard.artifact.store import Store
from modelyard.checks.adapter import LORA_MODULES, read_adapter, serve_rank
from modelyard.model.source import parse_source
from modelyard.stages.adapter import lora_overrides, verify_adapter
from tests.fixtures import make_tiny_llama


def make_adapter(base_model: Path, out: Path, *, r: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj"),
                 nonzero: bool = True, sigma: float = 0.5) -> Path:
    """A peft LoRA adapter of ``base_model`` saved to ``out``; ``nonzero`` fills lora_B with noise N(0, ``sigma``)
    (peft initialises it to zero, which leaves the output equal to the base's) so that applying it changes the
    logits. On the demo model, r 8: sigma 0.1 raises the reference texts' NLL by about 0.1 nats per token and still
    answers "Paris"; 0.5 by about 6.6 and answers noise (checks.adapter_numeric)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.bfloat16)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets),
                                                  lora_dropout=0.0, task_type="CAUSAL_LM"))
    if nonzero:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, sigma)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    return out


def _store_base(store_home: Path, model: Path, name: str = "tiny") -> Path:
    """A minimal base artifact ``name@r1`` in the folder store at ``store_home`` (manifest + model/)."""
    art = store_home / name / "r1"
    shutil.copytree(model, art / "model")
    Manifest.from_dict({"schema_version": "1", "name": name, "revision": "r1",
                        "content_digest": "sha256:" + "0" * 64}).save(art)
    return art


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = make_tiny_llama(root / "tiny")
    store = Store(root / "store")
    _store_base(store.home, base)
    return root, base, store


@pytest.fixture(scope="module")
def healthy(world):
    root, base, _ = world
    return make_adapter(base, root / "adapter")


def _codes(report):
    return [(f.code, f.severity.value) for f in report.findings if f.severity.value != "info"]


def test_healthy_adapter_passes(world, healthy):
    _, _, store = world
    report, base = verify_adapter(healthy, "tiny@r1", store)
    assert _codes(report) == [] and report.passed
    assert base.record() == {"name": "tiny", "revision": "r1", "digest": "sha256:" + "0" * 64}
    a = read_adapter(healthy)
    assert a.rank == 8 and len(a.tensors) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    # the base by its folder too
    report2, base2 = verify_adapter(healthy, str(store.home / "tiny" / "r1"), store)
    assert report2.passed and base2.digest == base.digest


def test_rank_above_max_lora_rank(world, healthy, tmp_path):
    root, base, store = world
    big = make_adapter(base, tmp_path / "r32", r=32)
    report, _ = verify_adapter(big, "tiny@r1", store, max_lora_rank=16)
    assert _codes(report) == [("adapter.rank_too_high", "error")]
    f = report.errors[0]
    assert (f.value, f.limit) == (32, 16) and "--max-lora-rank 32" in f.fix
    # without an explicit limit the serve plan picks the smallest allowed value that holds it
    assert verify_adapter(big, "tiny@r1", store)[0].passed and serve_rank(read_adapter(big)) == 32
    assert serve_rank(read_adapter(healthy)) == 16  # vLLM's default holds r=8


def test_other_hidden_size_is_a_shape_mismatch(world, tmp_path):
    root, _, store = world
    wide = make_tiny_llama(tmp_path / "wide", hidden=128, intermediate=256)
    adapter = make_adapter(wide, tmp_path / "wide-adapter")
    report, _ = verify_adapter(adapter, "tiny@r1", store)
    assert sorted(set(_codes(report))) == [("adapter.shape_mismatch", "error")]
    f = report.errors[0]
    assert f.field == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert f.value == [8, 128] and f.limit == [64, 64]


def test_more_layers_than_the_base(world, tmp_path):
    _, _, store = world
    deep = make_tiny_llama(tmp_path / "deep", layers=3)
    report, _ = verify_adapter(make_adapter(deep, tmp_path / "deep-adapter"), "tiny@r1", store)
    assert sorted(set(_codes(report))) == [("adapter.module_missing", "error")]
    assert "layer 2 is past the base's 2 layers" in report.errors[0].message


def test_target_module_vllm_cannot_apply_lora_to(world, tmp_path):
    root, base, store = world
    # rotary_emb is no linear layer: peft refuses it, so the twin renames q_proj's tensors to a module
    # name the base holds but vLLM's Llama does not adapt (input_layernorm's weight is 1-D, so use a made-up
    # linear name): the config and the tensors both say "rotary_proj"
    d = Path(shutil.copytree(make_adapter(base, tmp_path / "a"), tmp_path / "bad"))
    from safetensors.torch import load_file, save_file
    t = load_file(str(d / "adapter_model.safetensors"))
    save_file({k.replace("v_proj", "rotary_proj"): v for k, v in t.items()}, str(d / "adapter_model.safetensors"))
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj", "rotary_proj"]
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    report, _ = verify_adapter(d, "tiny@r1", store)
    assert _codes(report) == [("adapter.target_module_unsupported", "error")]
    assert report.errors[0].value == "rotary_proj"
    assert report.errors[0].limit == sorted(LORA_MODULES["LlamaForCausalLM"])


def test_missing_base(world, healthy):
    _, _, store = world
    for ref in ("tiny@nope", "nothere", str(healthy)):
        report, base = verify_adapter(healthy, ref, store)
        assert base is None and _codes(report) == [("adapter.base_missing", "error")], ref


def test_modules_to_save_and_dora(world, healthy, tmp_path):
    _, _, store = world
    d = Path(shutil.copytree(healthy, tmp_path / "mts"))
    cfg = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "modules_to_save": ["lm_head"], "use_dora": True}))
    report, _ = verify_adapter(d, "tiny@r1", store)
    assert _codes(report) == [("adapter.modules_to_save", "error"), ("adapter.unsupported_feature", "error")]


def test_an_adapter_file_that_links_out_of_its_folder_is_refused_before_it_is_read(world, healthy, tmp_path):
    """adapter_model.safetensors as a link to a file outside the adapter folder: refused as a model folder's link
    is (files.symlink_escapes), and `ingest` stores nothing (a model ingest refuses the same)."""
    from modelyard.errors import VerificationFailedError
    from modelyard.flows.adapter import ingest_adapter
    from modelyard.flows.options import IngestOptions

    _, _, store = world
    outside = tmp_path / "outside.safetensors"
    shutil.copy(healthy / "adapter_model.safetensors", outside)
    d = tmp_path / "linked"
    d.mkdir()
    shutil.copy(healthy / "adapter_config.json", d / "adapter_config.json")
    (d / "adapter_model.safetensors").symlink_to(outside)
    report, _ = verify_adapter(d, "tiny@r1", store)
    assert _codes(report) == [("files.symlink_escapes", "error")]
    assert report.errors[0].message == f"adapter_model.safetensors is a link to {outside}, outside the model folder"
    before = sorted(p.name for p in store.home.iterdir())
    with pytest.raises(VerificationFailedError):
        ingest_adapter(parse_source(f"file://{d}"), IngestOptions(base="tiny@r1", smoke=False, name="linked-lora"),
                       home=str(store.home))
    assert sorted(p.name for p in store.home.iterdir()) == before


def test_serve_overrides(healthy):
    assert lora_overrides([("tiny-lora", healthy, "model")]) == {
        "enable-lora": True, "lora-modules": ["tiny-lora=model"], "max-lora-rank": 16, "max-loras": 1}


def test_serve_overrides_of_two_adapters(world, healthy, tmp_path):
    """Two adapters on one base: both in lora-modules, max-loras 2, max-lora-rank the larger rank's (32 for r 24)."""
    _, base, _ = world
    wide = make_adapter(base, tmp_path / "wide", r=24)
    assert lora_overrides([("a", healthy, "adapters/a"), ("b", wide, "adapters/b")]) == {
        "enable-lora": True, "lora-modules": ["a=adapters/a", "b=adapters/b"], "max-lora-rank": 32, "max-loras": 2}


def test_ingest_adapter_artifact(world, healthy, tmp_path, monkeypatch):
    """`ingest file://ADAPTER --base NAME@REV --no-smoke`: a kind lora artifact naming its base by digest,
    with serve/vllm.yaml serving the base with the adapter."""
    from modelyard.flows.adapter import ingest_adapter
    from modelyard.flows.options import IngestOptions

    _, _, store = world
    res = ingest_adapter(parse_source(f"file://{healthy}"), IngestOptions(base="tiny@r1", smoke=False, name="tiny-lora"),
                         home=str(store.home))
    art = Path(res.artifact.path)
    m = Manifest.load(art)
    assert m.kind == "lora" and m.is_lora
    assert m.base.to_dict() == {"name": "tiny", "revision": "r1", "digest": "sha256:" + "0" * 64}
    assert sorted(f.path for f in m.files) == ["model/adapter_config.json", "model/adapter_model.safetensors"]
    cfg = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    assert cfg["model"] == "../../tiny/r1/model"
    assert (cfg["enable-lora"], cfg["lora-modules"], cfg["max-lora-rank"], cfg["max-loras"]) == \
        (True, ["tiny-lora=model"], 16, 1)
    assert (art / cfg["model"]).resolve() == (store.home / "tiny" / "r1" / "model").resolve()


def _compose_config(compose: Path, env: dict[str, str] | None = None) -> dict:
    """`docker-compose config` of ``compose`` (Debian docker-compose 1.29.2, no engine needed): the file
    as Compose resolves it, relative mounts made absolute against the compose file's folder."""
    import os
    import subprocess

    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "MODEL_DIR", "BASE_MODEL_DIR"))} \
        | (env or {})
    r = subprocess.run([exe, "-f", str(compose), "config"], capture_output=True, text=True, env=env, timeout=120,
                       cwd=compose.parent)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def _mounts(service: dict) -> dict[str, str]:
    """``{container path: host path}`` of a resolved compose service's volumes."""
    out = {}
    for v in service["volumes"]:
        if isinstance(v, str):
            host, target = v.split(":")[:2]
        else:
            host, target = v["source"], v["target"]
        out[target] = host
    return out


def test_stored_adapter_compose_runs_the_base_with_the_adapter(world, healthy):
    """The stored LoRA artifact's serve/compose.yaml: vLLM is started on the base model, mounted from the
    store where vllm.yaml's relative ``model`` points, and the adapter (``lora-modules`` ``NAME=model``,
    relative to the working folder) is the artifact's own model/."""
    from modelyard.flows.adapter import ingest_adapter
    from modelyard.flows.options import IngestOptions

    _, _, store = world
    res = ingest_adapter(parse_source(f"file://{healthy}"), IngestOptions(base="tiny@r1", smoke=False, name="tiny-lora3"),
                         home=str(store.home))
    art = Path(res.artifact.path)
    svc = _compose_config(art / "serve" / "compose.yaml")["services"]["vllm"]
    root = f"/store/tiny-lora3/{res.artifact.revision}"
    assert svc["working_dir"] == root
    assert svc["command"][:3] == ["/store/tiny/r1/model", "--config", f"{root}/serve/vllm.yaml"]
    mounts = _mounts(svc)
    assert Path(mounts["/store/tiny/r1/model"]).resolve() == (store.home / "tiny" / "r1" / "model").resolve()
    assert Path(mounts[f"{root}/model"]).resolve() == (art / "model").resolve()
    assert Path(mounts[f"{root}/serve/vllm.yaml"]).resolve() == (art / "serve" / "vllm.yaml").resolve()
    cfg = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    # vllm.yaml's relative paths resolve in the container as on the host
    assert os.path.normpath(os.path.join(root, cfg["model"])) == "/store/tiny/r1/model"
    assert cfg["lora-modules"] == ["tiny-lora3=model"]


def test_serve_plan_of_the_adapter_artifact(world, healthy, tmp_path):
    """`serve-plan ADAPTER_ARTIFACT --output DIR`: the base's plan, vllm.yaml with the adapter's LoRA keys,
    the base at DIR/model and the adapter at DIR/adapters/NAME (no path of this host in the files, which
    are copied to other hosts); compose mounts $MODEL_DIR / $ADAPTERS_DIR when set."""
    from tests.conftest import run_cli

    _, _, store = world
    from modelyard.flows.adapter import ingest_adapter
    from modelyard.flows.options import IngestOptions

    res = ingest_adapter(parse_source(f"file://{healthy}"), IngestOptions(base="tiny@r1", smoke=False, name="tiny-lora2"),
                         home=str(store.home))
    out = tmp_path / "out"
    r = run_cli("serve-plan", str(res.artifact.path), "--gpu", "H100-80GB", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    base_model = (store.home / "tiny" / "r1" / "model").resolve()
    adapter_model = Path(res.artifact.path).resolve() / "model"
    assert f"ln -s {base_model} {out}/model; ln -s {adapter_model} {out}/adapters/tiny-lora2" \
        in " ".join(r.stdout.split())
    cfg = yaml.safe_load((out / "serve" / "vllm.yaml").read_text())
    assert cfg["model"] == "model"
    assert cfg["enable-lora"] is True and cfg["lora-modules"] == ["tiny-lora2=adapters/tiny-lora2"]
    assert (cfg["max-lora-rank"], cfg["max-loras"], cfg["served-model-name"]) == (16, 1, "tiny")
    for p in (out / "serve").iterdir():
        text = p.read_text()
        assert str(store.home) not in text and str(store.home.resolve()) not in text, p.name
    svc = _compose_config(out / "serve" / "compose.yaml")["services"]["vllm"]
    assert svc["command"][0] == "/artifact/model" and svc["working_dir"] == "/artifact"
    assert _mounts(svc) == {"/artifact/model": str(out / "model"), "/artifact/adapters": str(out / "adapters"),
                            "/artifact/serve/vllm.yaml": str(out / "serve" / "vllm.yaml")}
    svc = _compose_config(out / "serve" / "compose.yaml", {"MODEL_DIR": "/srv/base", "ADAPTERS_DIR": "/srv/loras"}
                          )["services"]["vllm"]
    assert _mounts(svc)["/artifact/model"] == "/srv/base" and _mounts(svc)["/artifact/adapters"] == "/srv/loras"


def test_serve_plan_of_a_base_with_two_adapters(world, healthy, tmp_path):
    """`serve-plan BASE --lora A --lora B -o DIR`: one server, both adapters (vLLM names them by their
    lora-modules names); an adapter of another base is refused (exit 1, adapter.base_missing), as are --k8s
    (exit 2) and two adapters of one name (exit 2)."""
    from modelyard.flows.adapter import ingest_adapter
    from modelyard.flows.options import IngestOptions
    from tests.conftest import json_envelope, json_result, run_cli

    root, base, store = world
    wide = make_adapter(base, tmp_path / "wide", r=24)
    a = ingest_adapter(parse_source(f"file://{healthy}"), IngestOptions(base="tiny@r1", smoke=False, name="lora-a"),
                       home=str(store.home)).artifact
    b = ingest_adapter(parse_source(f"file://{wide}"), IngestOptions(base="tiny@r1", smoke=False, name="lora-b"),
                       home=str(store.home)).artifact
    out = tmp_path / "out"
    (out / "adapters").mkdir(parents=True)
    r = run_cli("serve-plan", "tiny@r1", "--store", str(store.home), "--lora", f"lora-a@{a.revision}",
                "--lora", str(b.path), "--gpu", "H100-80GB", "-o", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json_result(r.stdout, "serve-plan")["served_model_name"] == "tiny"
    cfg = yaml.safe_load((out / "serve" / "vllm.yaml").read_text())
    assert (cfg["model"], cfg["lora-modules"], cfg["max-lora-rank"], cfg["max-loras"]) == (
        "model", ["lora-a=adapters/lora-a", "lora-b=adapters/lora-b"], 32, 2)
    svc = _compose_config(out / "serve" / "compose.yaml")["services"]["vllm"]
    assert _mounts(svc)["/artifact/adapters"] == str(out / "adapters")  # the folder that exists, not $ADAPTERS_DIR
    # an adapter of another base
    _store_base(store.home, base, name="other")
    m = Manifest.load(Path(b.path)).to_dict()
    stray = root / "stray"
    shutil.copytree(b.path, stray)
    Manifest.from_dict({**m, "base": {"name": "other", "revision": "r1", "digest": "sha256:" + "1" * 64}}).save(stray)
    r = run_cli("serve-plan", "tiny@r1", "--store", str(store.home), "--lora", str(stray), "--gpu", "H100-80GB",
                "--no-write", "--json")
    error = json_envelope(r.stdout, "serve-plan", 1)["error"]
    assert r.returncode == 1 and [f["code"] for f in error["report"]["findings"]] == ["adapter.base_missing"]
    assert f"the adapter lora-b ({stray}) applies to sha256:{'1' * 64}, not to the base tiny" in error["message"]
    r = run_cli("serve-plan", "tiny@r1", "--store", str(store.home), "--lora", str(a.path), "--gpu", "H100-80GB",
                "--k8s", "--no-write")
    assert r.returncode == 2 and "serve/k8s does not carry LoRA adapters" in r.stderr
    r = run_cli("serve-plan", str(a.path), "--lora", str(a.path), "--gpu", "H100-80GB", "--no-write")
    assert r.returncode == 2 and "two adapters share a name (lora-a, lora-a)" in r.stderr


def test_upgrade_check_loads_an_adapter_on_its_base_never_as_a_model(world, healthy, tmp_path):
    """upgrade-check smoked a LoRA artifact as a model ("ensure the presence of a config.json") on both runtimes and
    said "no regression". It now loads the base with the adapter (vLLM's LoRA support, the rank the adapter's serve
    plan asks for), as the adapter's ingest smoke did; an adapter whose base left the store fails on both sides
    with the reason, and is no regression."""
    import shutil

    from modelyard.flows.adapter import ingest_adapter
    from modelyard.flows.options import IngestOptions
    from modelyard.settings import Settings
    from modelyard.stages import upgrade
    from modelyard.stages.upgrade import RunOutcome, Runtime

    _, _, store = world
    art = Path(ingest_adapter(parse_source(f"file://{healthy}"), IngestOptions(base="tiny@r1", smoke=False, name="tiny-lora-up"),
                              home=str(store.home)).artifact.path)
    seen = []

    def smoker(model_dir, settings, rt, *, mode, max_tokens, timeout, lora):
        seen.append((model_dir, rt.label, lora))
        return RunOutcome(passed=True, loads=True, answers=True, stops=True, numbers=None, vllm_version="0.32.0")

    cur, cand = Runtime("current", "/cur/python", "0.32.0"), Runtime("candidate", "/cand/python", "0.31.0")
    res = upgrade.upgrade_check([("tiny-lora-up", "r", art)], cur, cand, Settings(), smoker=smoker)
    base_model = (store.home / "tiny" / "r1" / "model").resolve()
    lora = ("tiny-lora-up", (art / "model").resolve(), 16)
    assert seen == [(base_model, "current", lora), (base_model, "candidate", lora)]
    assert (res.exit_code, res.artifacts[0].changes) == (0, ())
    orphan = tmp_path / "other-store" / "tiny-lora-up" / "r"
    shutil.copytree(art, orphan)
    seen.clear()
    res = upgrade.upgrade_check([("tiny-lora-up", "r", orphan)], cur, cand, Settings(), smoker=smoker)
    [a] = res.artifacts
    assert seen == [] and (res.exit_code, a.regressed, a.current.loads, a.candidate.loads) == (0, False, False, False)
    assert a.current.error == a.candidate.error == (
        f"the base tiny@r1 is not an artifact: {tmp_path / 'other-store' / 'tiny' / 'r1'} holds no artifact, the "
        f"adapter's manifest names sha256:{'0' * 64}")


@pytest.mark.parametrize("change,field,value", [
    ({"r": 8.0}, "r", 8.0), ({"r": "8"}, "r", "8"), ({"r": -8}, "r", -8), ({"r": 0}, "r", 0),
    ({"rank_pattern": {"q_proj": 4.5}}, "rank_pattern.q_proj", 4.5), ({"lora_alpha": None}, "lora_alpha", None)])
def test_a_declared_rank_vllm_cannot_read_is_refused(world, healthy, tmp_path, change, field, value):
    """vLLM's PEFTHelper needs r and lora_alpha and every rank a positive integer; a float, string, zero or negative
    r (or a missing lora_alpha) passed the gate and failed in vLLM."""
    _, _, store = world
    d = Path(shutil.copytree(healthy, tmp_path / "cfg"))
    cfg = json.loads((d / "adapter_config.json").read_text()) | change
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    report, _ = verify_adapter(d, "tiny@r1", store)
    assert _codes(report) == [("adapter.rank_invalid", "error")]
    f = report.errors[0]
    assert (f.field, f.value) == (field, value)
    what = f"{field} is missing" if field == "lora_alpha" else f"{field} is {value!r}"
    assert f.message == (f"adapter_config.json: {what}; vLLM needs r and lora_alpha, and every rank a positive integer")


def test_tensors_of_another_rank_than_declared_are_refused(world, tmp_path):
    """rank-32 tensors under ``r: 8`` (vLLM: "size 16 must match 32"-style failure when it copies them into
    buffers planned from r), and a rank_pattern entry that does not match its module's tensors."""
    root, base, store = world
    d = Path(shutil.copytree(make_adapter(base, tmp_path / "r32", r=32), tmp_path / "lying"))
    cfg = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "r": 8}))
    report, _ = verify_adapter(d, "tiny@r1", store)
    assert _codes(report) == [("adapter.rank_mismatch", "error")] * 8  # 2 layers x (q, v) x (A, B)
    f = report.errors[0]
    assert (f.field, f.value, f.limit) == ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 32, 8)
    assert f.message == ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has rank 32 (shape [32, 64]), "
                         "adapter_config.json declares rank 8 for model.layers.0.self_attn.q_proj")
    p = Path(shutil.copytree(make_adapter(base, tmp_path / "r8", r=8), tmp_path / "pattern"))
    cfg = json.loads((p / "adapter_config.json").read_text())
    (p / "adapter_config.json").write_text(json.dumps({**cfg, "rank_pattern": {"q_proj": 4}}))
    report, _ = verify_adapter(p, "tiny@r1", store)
    assert [(f.code, f.field.split(".")[6], f.value, f.limit) for f in report.errors] == [
        ("adapter.rank_mismatch", "q_proj", 8, 4)] * 4


def test_an_adapter_without_lora_tensors_is_refused(world, healthy, tmp_path):
    from safetensors.torch import load_file, save_file

    _, _, store = world
    d = Path(shutil.copytree(healthy, tmp_path / "empty"))
    t = load_file(str(d / "adapter_model.safetensors"))
    save_file({k.replace(".lora_A.", ".a.").replace(".lora_B.", ".b."): v for k, v in t.items()},
              str(d / "adapter_model.safetensors"))
    report, _ = verify_adapter(d, "tiny@r1", store)
    assert _codes(report) == [("adapter.no_lora_tensors", "error")]
    assert report.errors[0].message == ("adapter_model.safetensors holds no LoRA tensor (no *.lora_A / *.lora_B weight "
                                        "among its 8 tensor(s)); there is nothing for vLLM to apply")


def test_lm_head_of_a_tied_base_gets_the_right_reason(world, tmp_path):
    """An adapter on lm_head is fine on an untied Llama, and refused on a tied one because vLLM does not apply LoRA
    to a tied lm_head (it said "the base has no such module")."""
    from safetensors.torch import load_file, save_file

    root, base, store = world
    adapter = make_adapter(base, tmp_path / "head", targets=("q_proj", "lm_head"))
    assert verify_adapter(adapter, "tiny@r1", store)[0].passed
    tied = Path(shutil.copytree(base, tmp_path / "tied"))
    for f in tied.iterdir():
        f.chmod(0o644)
    w = load_file(str(tied / "model.safetensors"))
    save_file({k: v for k, v in w.items() if k != "lm_head.weight"}, str(tied / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    _store_base(store.home, tied, name="tied")
    report, _ = verify_adapter(adapter, "tied@r1", store)
    assert _codes(report) == [("adapter.target_module_unsupported", "error")]
    assert report.errors[0].message.startswith("the adapter adapts lm_head (base_model.model.lm_head.lora_")
    assert report.errors[0].message.endswith("the base ties lm_head to embed_tokens (tie_word_embeddings), and vLLM "
                                             "does not apply LoRA to a tied lm_head")


def test_a_failed_adapter_smoke_blames_the_adapter_not_the_base():
    """A broken adapter's failed smoke gave the base model's fix ("check generation_config.json eos_token_id"); the
    base answered the same prompt in the same engine, so the message shows both answers and the fix is the
    adapter's."""
    from modelyard.stages import smoke

    res = smoke.SmokeResult(
        passed=False, vllm_version="0.32.0", question="What is the capital of France?", text="fr fr fr fr",
        finish_reason="length", last_token=None, prompt_tokens=9, completion_tokens=16, load_seconds=1.0,
        generate_seconds=1.0, tokens_per_second=16.0, max_model_len=4096, enforce_eager=True, wall_seconds=3.0,
        error="finish_reason length, not stop", lora={"name": "bad-lora", "base_text": "Paris.", "text": "fr fr fr fr", "differs": True})
    err = smoke.gate_error(res)
    assert err.message == ("vLLM smoke chat with the LoRA adapter bad-lora failed: finish_reason length, not stop; the "
                           "adapter's answer was 'fr fr fr fr', the base's 'Paris.'")
    assert err.fix.startswith("The adapter, not the base, breaks the answer") and "eos_token_id" not in err.fix
    same = dataclasses.replace(res, text="Paris. Paris.", lora={**res.lora, "text": "Paris. Paris.", "differs": False})
    assert smoke.gate_error(same).fix == "Check generation_config.json eos_token_id against the chat template's turn terminator."


def test_a_refused_server_smoke_says_what_the_judged_finding_says():
    """A wrecked adapter refused by the server smoke said only "failed: numeric, golden:..." and the fix (a new user's
    run): the first judged finding's message, with its figures, is in the error now, as in the load smoke's."""
    from modelyard.stages import smoke
    from modelyard.stages.smoke.server import ServerSmokeResult

    finding = {"code": "smoke.numeric.adapter_degrades", "severity": "error", "fix": "The adapter wrecks what the base knows.",
               "message": "the adapter raises its base's negative log-likelihood on the reference texts by 3.200 nats per token"}
    res = ServerSmokeResult(passed=False, level="server", vllm_version="0.32.0", served_model_name="my-lora", question="q",
                            text="a-en-a", finish_reason="length", prompt_tokens=3, completion_tokens=8, stream_text="a-en-a",
                            checks=(), golden=(), golden_source=None, bench=None, startup_seconds=1.0, wall_seconds=2.0,
                            error="failed: numeric", findings=(finding,))
    err = smoke.gate_error(res)
    assert err.message == ("vLLM server smoke failed (failed: numeric): the adapter raises its base's negative "
                           "log-likelihood on the reference texts by 3.200 nats per token; answer was 'a-en-a'")
    assert err.fix == "The adapter wrecks what the base knows."


def test_the_base_is_found_by_the_name_the_store_keeps(world, healthy):
    """The docs' `--base SmolLM2-135M-Instruct@REV` was refused as missing: the store keeps smollm2-135m-instruct."""
    _, _, store = world
    report, base = verify_adapter(healthy, "TINY@r1", store)
    assert report.passed and base.record()["name"] == "tiny"
