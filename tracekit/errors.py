"""The one exception type for input that tracekit cannot use."""


class TraceError(Exception):
    """Bad input: `path` names the file or directory, `reason` says what is wrong (one line)."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")
