"""The keep-or-reset loop behind orchestrate.py.

For the kernel with the most end-to-end gain left: copy it into kernel.py, commit and bench it (the
baseline); then again and again ask the agent for one change, commit it ("exp N <kernel>: ..."),
bench it in a child process, keep the commit if it is correct and faster than the best kept version
by more than max(1%, the noise measured at the baseline), else reset the branch to the best. On a GPU a
keep is confirmed first: the best kept version and the candidate are benched once more, and the change
stays only if the candidate's slower time still beats the best's faster one by that margin (one slow
measurement of the best would otherwise let a change that does nothing through). A candidate that
launches exactly what the best launches (autokernel/harness/launch_record.py) is reverted untimed. Every
experiment is one results.tsv row carrying its commit (reverted commits stay reachable by sha for
`git show` until git's garbage collection). Only kernel.py may change: whatever else the agent
touched is put back and the experiment counts as reverted.

Parked and done. After --max-reverts in a row, or at the end of its time share, a kernel is parked and
the next one in Amdahl order goes on; when every kernel is parked or done and time is left, the parked
ones go round again (reverts in a row reset, the time left shared anew: budget.py), each starting from
its best (a "back to its best" commit). A kernel is done for good at the target speedup or fraction of
peak, when the agent has nothing left to try, when it never had a correct version or its last changes
never reached the harness, or after --per-kernel-minutes. The agent's one last move (Agent.finish)
comes when a kernel is done, or, for the others, once the time or benches left only cover those moves.

Crash safety. workspace/loop_state.json (written atomically) holds the queue, each kernel's best
commit, and the experiment in flight. An experiment's outcome is written there before its row goes
to results.tsv and before the state moves on, so a restart after kill -9 at any moment either finds
the outcome and finishes recording it, or finds none and resets the branch to the best commit and
does the experiment again: no kept experiment is lost, no unrecorded commit stays on the branch.

Layout: engine.py (LoopConfig, Loop: start, resume, which kernel goes on, parked and done), experiment.py (one
experiment: the agent's edit, its commit and bench, the confirmation on a GPU), recording.py (its outcome into
the state and results.tsv, in the order above), decision.py (keep or revert).
"""

from autokernel.loop.decision import HOST_NOISE_PCT, MIN_GAIN_PCT, decide, host_grew
from autokernel.loop.engine import Loop, LoopConfig
from autokernel.loop.experiment import harness_hashes
from autokernel.loop.gitlog import GitError
from autokernel.loop.state import LoopError

__all__ = ["Loop", "LoopConfig", "LoopError", "GitError", "decide", "harness_hashes", "host_grew", "HOST_NOISE_PCT",
           "MIN_GAIN_PCT"]
