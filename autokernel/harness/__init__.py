"""The bench of one kernel file: the static check, the five stages and timing in a child process (harness.py),
started fresh or forked from the warm launcher (runner.py, zygote.py), and the guards, checks and timers it runs on.

Below it: the registry and the ops room. It imports nothing from profile/, verify/, loop/ or cuda/.
"""
