"""Errors the user can fix: the CLI prints each as one line on stderr and exits 2 (and one that
is not the input's fault, `WorkerDied`: one line, exit 1)."""


class TracekitError(Exception):
    """Input or options that tracekit cannot use."""


class TraceError(TracekitError):
    """Bad input: `path` names the file or directory, `reason` says what is wrong (one line)."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):  # raised in a worker process, re-raised here
        return type(self), (self.path, self.reason)


class UsageError(TracekitError):
    """An option that cannot work here (a bad pattern, a missing optional extra)."""


class WorkerDied(Exception):
    """A worker process that ended abruptly (a signal: the out-of-memory killer's SIGKILL, a
    crash): not the user's input, so the CLI prints it as one line and exits 1."""
