"""``uniagent verify``: each task's oracle and a no-op baseline, through the run's sandbox and
reward, to find tasks that cannot teach anything (see docs/tasks.md).

:mod:`uniagent.verify.oracle` knows what an oracle is for each kind of task (a Harbor
``solution/solve.sh``, a SWE-bench row's gold ``patch``); :mod:`uniagent.verify.check`
runs the attempts and classifies each task; :mod:`uniagent.verify.report` writes the
records and the exclude list ``uniagent run --exclude`` reads.
"""
