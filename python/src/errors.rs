//! UCXX's exceptions, by name, so that code which catches them keeps working; and the one place
//! where a ucx-rs error becomes one of them.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use ucx_sys as sys;

create_exception!(_ucxrs, UCXError, PyException, "A UCX operation failed.");
create_exception!(
    _ucxrs,
    UCXCanceledError,
    UCXError,
    "The operation was canceled (its endpoint closed while it was pending)."
);
create_exception!(_ucxrs, UCXCloseError, UCXError, "The endpoint is closed.");
create_exception!(
    _ucxrs,
    UCXConnectionResetError,
    UCXError,
    "The peer went away (its process ended, or it closed the connection)."
);
create_exception!(
    _ucxrs,
    UCXMessageTruncatedError,
    UCXError,
    "A message arrived that is larger than the receive buffer."
);
create_exception!(
    _ucxrs,
    UCXNotConnectedError,
    UCXError,
    "The endpoint is not connected."
);
create_exception!(
    _ucxrs,
    UCXUnreachableError,
    UCXError,
    "The peer cannot be reached."
);
create_exception!(
    _ucxrs,
    UCXTimedOutError,
    UCXError,
    "The operation did not finish in time."
);
create_exception!(
    _ucxrs,
    UCXConfigError,
    UCXError,
    "A UCX configuration option is unknown or its value is invalid."
);

/// The UCXX exception for a ucx-rs error.
pub fn to_py(e: ucx::Error) -> PyErr {
    let text = e.to_string();
    match e {
        ucx::Error::Ucx(s) => {
            let is = |status: sys::ucs_status_t| s.code() == i32::from(status);
            if is(sys::UCS_ERR_CANCELED) {
                UCXCanceledError::new_err(text)
            } else if is(sys::UCS_ERR_MESSAGE_TRUNCATED) {
                UCXMessageTruncatedError::new_err(text)
            } else if is(sys::UCS_ERR_UNREACHABLE) {
                UCXUnreachableError::new_err(text)
            } else if is(sys::UCS_ERR_NOT_CONNECTED) {
                UCXNotConnectedError::new_err(text)
            } else if is(sys::UCS_ERR_TIMED_OUT) {
                UCXTimedOutError::new_err(text)
            } else if s.is_peer_failure() {
                UCXConnectionResetError::new_err(text)
            } else {
                UCXError::new_err(text)
            }
        }
        ucx::Error::Truncated { .. } => UCXMessageTruncatedError::new_err(text),
        ucx::Error::Closed => UCXCanceledError::new_err(text),
        ucx::Error::Timeout(_) => UCXTimedOutError::new_err(text),
        ucx::Error::UnknownOption(_) | ucx::Error::InvalidOption { .. } => {
            UCXConfigError::new_err(text)
        }
        _ => UCXError::new_err(text),
    }
}

/// Adds the exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("UCXError", py.get_type::<UCXError>())?;
    m.add("UCXCanceledError", py.get_type::<UCXCanceledError>())?;
    m.add("UCXCloseError", py.get_type::<UCXCloseError>())?;
    m.add(
        "UCXConnectionResetError",
        py.get_type::<UCXConnectionResetError>(),
    )?;
    m.add(
        "UCXMessageTruncatedError",
        py.get_type::<UCXMessageTruncatedError>(),
    )?;
    m.add(
        "UCXNotConnectedError",
        py.get_type::<UCXNotConnectedError>(),
    )?;
    m.add("UCXUnreachableError", py.get_type::<UCXUnreachableError>())?;
    m.add("UCXTimedOutError", py.get_type::<UCXTimedOutError>())?;
    m.add("UCXConfigError", py.get_type::<UCXConfigError>())?;
    Ok(())
}
