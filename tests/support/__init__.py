"""What the tests share, and only the tests (and bench/): no test module imports another.

- `waiting`: `eventually`, the one way a test waits for a condition, and `done_at`;
- `clock`: `run_on_virtual_time`, a loop whose clock moves only to its next timer;
- `procs`: real processes (`fusee server`, workers, uvicorn, the Lambda runtime), their
  output collected line by line, stopped with real signals (bench/_server_procs.py's
  children too);
- `workers`: the lines a worker process prints for `procs.Worker` to read;
- `server_cli`: the server's command line and HTTP API (a start that must fail, a token
  file, `--invoke` endpoints, a GET);
- `runs_cli`: `fusee runs` as a process or in this process, and who it says asked;
- `handlers`: what the handler's tests run against (a counting listener, the Lambda
  Runtime API), a valid invocation body, `in_thread`;
- `cluster`: the one cluster of processes (a `fusee server` on a fixed port, restarted
  on it, and its handler or workers) for tests/invoke/, tests/model/ and
  bench/invoke_cost.py; an invoked server's metrics and `quiet`;
- `invoked`: a run that sleeps through an invocation, fake endpoints in front of the
  handler;
- `engine_kit`: helpers of the in-process engine's tests (turns, the virtual clock moved
  with the work of each due time, parked runs, slow or held run-store reads);
- `golden`: the workflows of the golden journals (tests/engine/golden/).

Fault injection into the project's own components goes through `fusee.testing.faults`.
"""
