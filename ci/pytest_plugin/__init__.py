"""lanekeeper's pytest plugin, one idea per module.

    run        what the plugin learns during one run (RunState), its options, SIGTERM as ^C
    parametrize  the runner x graph x handoff cells a test that takes `cell` runs in
    shards     --lk-shard K/N, and a matrix cell as one unit of work under pytest-xdist
    timeouts   a hard timeout for every test, and the lane budget (pytest-timeout's --session-timeout)
    stalls     on a watchdog diagnosis or a timeout: stacks, engines killed, the stall report
    leaks      an engine process that outlives its test fails the test
    books      results kept where the run is reported; the matrix summary; a run that only skipped is red

It loads through the `pytest11` entry point in any project that installs lanekeeper.  Everywhere:
hard timeouts, stalls, leaks, the books.  The matrix and default timeouts by marker only where the
ini asks (`lanekeeper_matrix = true`, `lanekeeper_timeouts`).

Options
  --lk-platform / --lk-runner / --lk-cuda-graph / --lk-handoff   narrow the runner x graph x handoff matrix
  --lk-profile NAME|PATH    the deploy profile every engine and server of the run resolves (a lane's
                         `profile:`); matrix cells override only their own axes on top of it
  --lk-backend torch|vllm   the stage-0 backend the matrix runs on; cells a backend cannot run here
                         are skipped with the backend's own reason
  --lk-set KEY=VALUE        a profile setting (repeatable) every engine and server of the matrix applies
                         on top of its cell, after the test watchdog
  --lk-report-dir DIR       where stall-report.{json,md} and matrix-summary.md go
  --lk-shard K/N            run only the K-th of N shards: whole matrix cells, other tests one by one,
                         balanced by test count, the same split whatever the collection order
  --session-timeout S    (pytest-timeout's) the lane budget: no test starts after it, and none runs past it

Under pytest-xdist (-n N) workers run the tests and the controller keeps the books: results,
stall incidents (carried on the reports) and a worker's exhausted budget reach it, so the
summary, stall report and exit status are those of a serial run.
"""
pytest_plugins = [f"ci.pytest_plugin.{name}"
                  for name in ("run", "parametrize", "shards", "timeouts", "stalls", "leaks", "books")]
