"""Every outside process modelyard starts: the runtime venvs (where they are, the environment they run
in), one way to run a script with a timeout and a process-group kill (:mod:`.process`), the stdlib-only
runner scripts executed inside the other interpreters (:mod:`.scripts`), the warm facts worker's server
(:mod:`.facts_server`) and the Prefect API server (:mod:`.prefect_server`).

This layer sits between the stages (which decide what to run) and transport: it imports only from
transport and below, and the stages and flows call it."""
