"""What the tests share, and only the tests (and bench/): no test module imports another.

- `waiting`: `eventually`, the one way a test waits for a condition;
- `procs`: real processes (`fusee server`, workers, uvicorn, the Lambda runtime), their
  output collected line by line, stopped with real signals;
- `handlers`: what the handler's tests run against (a counting listener, the Lambda
  Runtime API), and `in_thread`;
- `invoked`: an invoked cluster (`fusee server --invoke` and uvicorn serving the handler);
- `engine_kit`: helpers of the in-process engine's tests (turns, parked runs, slow reads).
"""
