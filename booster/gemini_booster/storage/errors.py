"""What a storage call refuses with, whichever aggregate it writes: shared by every module
of ``storage/`` so that the service layer maps each to one HTTP status and one CLI message."""


class NotFound(LookupError):
    """The named policy, token or host has no row (REST: 404)."""


class Conflict(Exception):
    """The write would break a uniqueness rule, e.g. a name taken (REST: 409)."""
