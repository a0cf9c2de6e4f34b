"""UCXX's exceptions, where UCXX keeps them (``ucxx.exceptions``)."""

from ._ucxrs import (  # noqa: F401
    UCXCanceledError,
    UCXCloseError,
    UCXConfigError,
    UCXConnectionResetError,
    UCXError,
    UCXMessageTruncatedError,
    UCXNotConnectedError,
    UCXTimedOutError,
    UCXUnreachableError,
)

UCXCanceled = UCXCanceledError
