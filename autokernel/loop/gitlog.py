"""The one git wrapper: everything the loop does to the repository goes through here (gitpython).

The loop owns the work tree while it runs: it commits each candidate `kernel.py`, keeps the commit or
resets to the best one, and puts back anything else an agent touched. Run-time artifacts (results.tsv,
workspace/, progress.png) are never part of an experiment, whether or not the user's .gitignore lists
them. Commits work in a fresh repository with no git identity: the loop then signs as AutoKernel
through the commit's environment, never through the user's global config.
"""

from __future__ import annotations

import os
from pathlib import Path

import git

KERNEL_PATH = "kernel.py"  # the one file an agent may change
# Written by the loop and the harness at run time; never counted as a change to the work tree.
ARTIFACTS = ("workspace/", "results.tsv", "progress.png", "__pycache__/", ".pytest_cache/", ".ruff_cache/")
FALLBACK_IDENTITY = {
    "GIT_AUTHOR_NAME": "AutoKernel", "GIT_AUTHOR_EMAIL": "autokernel@localhost",
    "GIT_COMMITTER_NAME": "AutoKernel", "GIT_COMMITTER_EMAIL": "autokernel@localhost",
}


class GitError(Exception):
    """The repository is not in a state the loop can work with; the message says what to do."""


def is_artifact(path: str) -> bool:
    return path.endswith((".pyc", ".lock")) or any(
        path == a.rstrip("/") or path.startswith(a) or f"/{a}" in f"/{path}" for a in ARTIFACTS)


class GitLog:
    def __init__(self, root: str | Path):
        try:
            self.repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise GitError(f"{root} is not a git repository: run `git init && git add -A && "
                           "git commit -m init` there first") from None
        if self.repo.bare:
            raise GitError(f"{root} is a bare repository; the loop needs a work tree")
        self.root = Path(self.repo.working_tree_dir)
        self._env = None

    # ------------------------------------------------------------------ reading
    def head(self) -> str | None:
        try:
            return self.repo.head.commit.hexsha
        except ValueError:  # no commit yet
            return None

    def branch(self) -> str | None:
        return None if self.repo.head.is_detached else self.repo.active_branch.name

    def branch_exists(self, name: str) -> bool:
        return name in [h.name for h in self.repo.heads]

    def branch_head(self, name: str) -> str:
        return self.repo.heads[name].commit.hexsha

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        return self.repo.is_ancestor(ancestor, descendant)

    def subject(self, sha: str) -> str:
        return self.repo.commit(sha).summary

    def file_at(self, sha: str, path: str) -> str:
        return self.repo.git.show(f"{sha}:{path}")

    def blob(self, sha: str, path: str) -> str:
        """The id of `path`'s content at `sha` (equal ids: the same bytes)."""
        return self.repo.git.rev_parse(f"{sha}:{path}")

    def log(self, ref: str = "HEAD", limit: int = 200) -> list[tuple[str, str]]:
        """(sha, subject) from newest to oldest."""
        return [(c.hexsha, c.summary) for c in self.repo.iter_commits(ref, max_count=limit)]

    def changes(self) -> dict[str, str]:
        """Changed paths against HEAD -> porcelain code ("M", "D", "??", ...), artifacts left out."""
        out = self.repo.git.status("--porcelain=v1", "-z", "--untracked-files=all")
        found, items = {}, iter(out.split("\0"))
        for item in items:
            if not item:
                continue
            code, path = item[:2].strip(), item[3:]
            if code.startswith("R") or code.startswith("C"):
                found[next(items, "")] = "D"  # a rename's source is the entry after it
            if not is_artifact(path):
                found[path] = code
        return found

    def untracked(self) -> set[str]:
        return {p for p, code in self.changes().items() if code == "??"}

    def require_clean(self) -> None:
        dirty = self.changes()
        if dirty:
            listed = ", ".join(f"{code} {path}" for path, code in sorted(dirty.items())[:8])
            more = f" and {len(dirty) - 8} more" if len(dirty) > 8 else ""
            raise GitError(
                f"the work tree has uncommitted changes ({listed}{more}). The loop resets the tree "
                "between experiments and would lose them: commit them, stash them (git stash -u), or "
                "add untracked files to .gitignore, then start again.")

    # ------------------------------------------------------------------ writing
    def identity_env(self) -> dict:
        """The user's git identity when one is configured, else AutoKernel's (for these commits only)."""
        if self._env is None:
            try:
                self.repo.git.var("GIT_COMMITTER_IDENT")
                self.repo.git.var("GIT_AUTHOR_IDENT")
                self._env = {}
            except git.GitCommandError:
                self._env = dict(FALLBACK_IDENTITY)
        return self._env

    def checkout_branch(self, name: str) -> bool:
        """Switch to branch `name`, creating it at HEAD when missing. True when created."""
        created = not self.branch_exists(name)
        if created:
            if self.head() is None:
                raise GitError("the repository has no commit yet: commit the project first")
            self.repo.git.checkout("-b", name)
        elif self.branch() != name:
            self.repo.git.checkout(name)
        return created

    def commit_kernel(self, message: str) -> str:
        """Commit kernel.py as it is in the work tree (an unchanged file makes an empty commit)."""
        self.repo.git.add("--", KERNEL_PATH)
        self.repo.git.commit("-m", message, "--no-verify", "--allow-empty", "--", KERNEL_PATH,
                             env=self.identity_env())
        return self.head()

    def amend_message(self, message: str) -> str:
        self.repo.git.commit("--amend", "-m", message, "--no-verify", "--allow-empty", "--only",
                             env=self.identity_env())
        return self.head()

    def reset_hard(self, sha: str, keep_untracked: set[str] = frozenset()) -> None:
        """Tracked files back to `sha`; untracked files not in `keep_untracked` removed."""
        self.repo.git.reset("--hard", sha)
        self.remove_untracked(keep_untracked)

    def reset_kernel(self, sha: str) -> None:
        """Move the branch back to `sha` with kernel.py as it is there; every other file is left alone."""
        self.repo.git.reset("--soft", sha)
        self.repo.git.checkout(sha, "--", KERNEL_PATH)

    def reset_mixed(self, sha: str) -> None:
        """Move the branch back to `sha` and keep the work tree (undo commits an agent made)."""
        self.repo.git.reset("--mixed", "-q", sha)

    def remove_untracked(self, keep: set[str] = frozenset()) -> list[str]:
        removed = []
        for path in sorted(self.untracked() - set(keep)):
            full = self.root / path
            if full.is_file() or full.is_symlink():
                full.unlink()
                removed.append(path)
        return removed

    def restore(self, paths: list[str], sha: str, keep_untracked: set[str] = frozenset()) -> None:
        """Put `paths` back as they are in `sha`: tracked ones checked out, new ones deleted."""
        tracked = set(self.repo.git.ls_tree("-r", "--name-only", sha).splitlines())
        back = [p for p in paths if p in tracked]
        if back:
            self.repo.git.checkout(sha, "--", *back)
        for p in paths:
            if p not in tracked and p not in keep_untracked:
                full = self.root / p
                if full.is_file() or full.is_symlink():
                    os.unlink(full)
