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
// A subclass of UCXCanceledError: UCXX cancels what is in flight on an endpoint whose peer
// failed (its error callback closes the endpoint), so code written for it, and its tests,
// catch UCXCanceledError there.
create_exception!(
    _ucxrs,
    UCXConnectionResetError,
    UCXCanceledError,
    "The peer went away (its process ended, or it closed the connection). Also a \
     UCXCanceledError: what was in flight on the endpoint ends, as UCXX cancels it."
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
    UCXInvalidParamError,
    "A UCX configuration option is unknown or its value is invalid (UCX says UCS_ERR_INVALID_PARAM: \
     a UCXInvalidParamError too, as UCXX raises)."
);

// The rest of UCXX's exceptions, one per UCX status (UCXX's are flat under UCXError; the
// peer failures here are also UCXConnectionResetErrors, which is what ucxrs raised for them
// before they had names of their own, so code catching that keeps working).
create_exception!(
    _ucxrs,
    UCXNoMessageError,
    UCXError,
    "No message matched (UCS_ERR_NO_MESSAGE)."
);
create_exception!(
    _ucxrs,
    UCXNoResourceError,
    UCXError,
    "UCX ran out of a resource (UCS_ERR_NO_RESOURCE)."
);
create_exception!(
    _ucxrs,
    UCXIOError,
    UCXConnectionResetError,
    "An input/output error on the connection (UCS_ERR_IO_ERROR); a kind of peer failure here."
);
create_exception!(
    _ucxrs,
    UCXNoMemoryError,
    UCXError,
    "UCX could not allocate memory (UCS_ERR_NO_MEMORY)."
);
create_exception!(
    _ucxrs,
    UCXInvalidParamError,
    UCXError,
    "UCX refused a parameter (UCS_ERR_INVALID_PARAM)."
);
create_exception!(
    _ucxrs,
    UCXInvalidAddrError,
    UCXError,
    "An invalid address (UCS_ERR_INVALID_ADDR)."
);
create_exception!(
    _ucxrs,
    UCXNotImplementedError,
    UCXError,
    "Not implemented by UCX or its transports (UCS_ERR_NOT_IMPLEMENTED)."
);
create_exception!(
    _ucxrs,
    UCXNoProgressError,
    UCXError,
    "No progress could be made (UCS_ERR_NO_PROGRESS)."
);
create_exception!(
    _ucxrs,
    UCXBufferTooSmallError,
    UCXError,
    "A buffer is too small (UCS_ERR_BUFFER_TOO_SMALL)."
);
create_exception!(
    _ucxrs,
    UCXNoElemError,
    UCXError,
    "No such element (UCS_ERR_NO_ELEM)."
);
create_exception!(
    _ucxrs,
    UCXSomeConnectsFailedError,
    UCXError,
    "Some connections failed (UCS_ERR_SOME_CONNECTS_FAILED)."
);
create_exception!(
    _ucxrs,
    UCXNoDeviceError,
    UCXError,
    "No device to use (UCS_ERR_NO_DEVICE)."
);
create_exception!(
    _ucxrs,
    UCXBusyError,
    UCXError,
    "Busy: an address in use, say (UCS_ERR_BUSY)."
);
create_exception!(
    _ucxrs,
    UCXShmemSegmentError,
    UCXError,
    "A shared memory segment failed (UCS_ERR_SHMEM_SEGMENT)."
);
create_exception!(
    _ucxrs,
    UCXAlreadyExistsError,
    UCXError,
    "It already exists (UCS_ERR_ALREADY_EXISTS)."
);
create_exception!(
    _ucxrs,
    UCXOutOfRangeError,
    UCXError,
    "Out of range (UCS_ERR_OUT_OF_RANGE)."
);
create_exception!(
    _ucxrs,
    UCXExceedsLimitError,
    UCXError,
    "A limit was exceeded (UCS_ERR_EXCEEDS_LIMIT)."
);
create_exception!(
    _ucxrs,
    UCXUnsupportedError,
    UCXError,
    "Unsupported (UCS_ERR_UNSUPPORTED)."
);
create_exception!(
    _ucxrs,
    UCXRejectedError,
    UCXConnectionResetError,
    "The peer rejected the connection (UCS_ERR_REJECTED); a kind of peer failure here."
);
create_exception!(
    _ucxrs,
    UCXFirstLinkFailureError,
    UCXConnectionResetError,
    "A link failed (UCS_ERR_FIRST_LINK_FAILURE)."
);
create_exception!(
    _ucxrs,
    UCXLastLinkFailureError,
    UCXConnectionResetError,
    "A link failed (UCS_ERR_LAST_LINK_FAILURE)."
);
create_exception!(
    _ucxrs,
    UCXFirstEndpointFailureError,
    UCXConnectionResetError,
    "The endpoint failed (UCS_ERR_FIRST_ENDPOINT_FAILURE)."
);
create_exception!(
    _ucxrs,
    UCXEndpointTimeoutError,
    UCXConnectionResetError,
    "The peer stopped answering (UCS_ERR_ENDPOINT_TIMEOUT); a kind of peer failure here."
);
create_exception!(
    _ucxrs,
    UCXLastEndpointFailureError,
    UCXConnectionResetError,
    "The endpoint failed (UCS_ERR_LAST_ENDPOINT_FAILURE)."
);

/// The UCXX exception for a ucx-rs error.
pub fn to_py(e: ucx::Error) -> PyErr {
    let text = e.to_string();
    match e {
        ucx::Error::Ucx(s) => match s.code() {
            c if c == i32::from(sys::UCS_ERR_CANCELED) => UCXCanceledError::new_err(text),
            c if c == i32::from(sys::UCS_ERR_MESSAGE_TRUNCATED) => {
                UCXMessageTruncatedError::new_err(text)
            }
            c if c == i32::from(sys::UCS_ERR_UNREACHABLE) => UCXUnreachableError::new_err(text),
            c if c == i32::from(sys::UCS_ERR_NOT_CONNECTED) => UCXNotConnectedError::new_err(text),
            c if c == i32::from(sys::UCS_ERR_TIMED_OUT) => UCXTimedOutError::new_err(text),
            c if c == i32::from(sys::UCS_ERR_CONNECTION_RESET) => {
                UCXConnectionResetError::new_err(text)
            }
            c => match c as sys::ucs_status_t {
                sys::UCS_ERR_NO_MESSAGE => UCXNoMessageError::new_err(text),
                sys::UCS_ERR_NO_RESOURCE => UCXNoResourceError::new_err(text),
                sys::UCS_ERR_IO_ERROR => UCXIOError::new_err(text),
                sys::UCS_ERR_NO_MEMORY => UCXNoMemoryError::new_err(text),
                sys::UCS_ERR_INVALID_PARAM => UCXInvalidParamError::new_err(text),
                sys::UCS_ERR_INVALID_ADDR => UCXInvalidAddrError::new_err(text),
                sys::UCS_ERR_NOT_IMPLEMENTED => UCXNotImplementedError::new_err(text),
                sys::UCS_ERR_NO_PROGRESS => UCXNoProgressError::new_err(text),
                sys::UCS_ERR_BUFFER_TOO_SMALL => UCXBufferTooSmallError::new_err(text),
                sys::UCS_ERR_NO_ELEM => UCXNoElemError::new_err(text),
                sys::UCS_ERR_SOME_CONNECTS_FAILED => UCXSomeConnectsFailedError::new_err(text),
                sys::UCS_ERR_NO_DEVICE => UCXNoDeviceError::new_err(text),
                sys::UCS_ERR_BUSY => UCXBusyError::new_err(text),
                sys::UCS_ERR_SHMEM_SEGMENT => UCXShmemSegmentError::new_err(text),
                sys::UCS_ERR_ALREADY_EXISTS => UCXAlreadyExistsError::new_err(text),
                sys::UCS_ERR_OUT_OF_RANGE => UCXOutOfRangeError::new_err(text),
                sys::UCS_ERR_EXCEEDS_LIMIT => UCXExceedsLimitError::new_err(text),
                sys::UCS_ERR_UNSUPPORTED => UCXUnsupportedError::new_err(text),
                sys::UCS_ERR_REJECTED => UCXRejectedError::new_err(text),
                sys::UCS_ERR_FIRST_LINK_FAILURE => UCXFirstLinkFailureError::new_err(text),
                sys::UCS_ERR_LAST_LINK_FAILURE => UCXLastLinkFailureError::new_err(text),
                sys::UCS_ERR_FIRST_ENDPOINT_FAILURE => UCXFirstEndpointFailureError::new_err(text),
                sys::UCS_ERR_ENDPOINT_TIMEOUT => UCXEndpointTimeoutError::new_err(text),
                sys::UCS_ERR_LAST_ENDPOINT_FAILURE => UCXLastEndpointFailureError::new_err(text),
                _ if s.is_peer_failure() => UCXConnectionResetError::new_err(text),
                _ => UCXError::new_err(text),
            },
        },
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
    m.add("UCXNoMessageError", py.get_type::<UCXNoMessageError>())?;
    m.add("UCXNoResourceError", py.get_type::<UCXNoResourceError>())?;
    m.add("UCXIOError", py.get_type::<UCXIOError>())?;
    m.add("UCXNoMemoryError", py.get_type::<UCXNoMemoryError>())?;
    m.add(
        "UCXInvalidParamError",
        py.get_type::<UCXInvalidParamError>(),
    )?;
    m.add("UCXInvalidAddrError", py.get_type::<UCXInvalidAddrError>())?;
    m.add(
        "UCXNotImplementedError",
        py.get_type::<UCXNotImplementedError>(),
    )?;
    m.add("UCXNoProgressError", py.get_type::<UCXNoProgressError>())?;
    m.add(
        "UCXBufferTooSmallError",
        py.get_type::<UCXBufferTooSmallError>(),
    )?;
    m.add("UCXNoElemError", py.get_type::<UCXNoElemError>())?;
    m.add(
        "UCXSomeConnectsFailedError",
        py.get_type::<UCXSomeConnectsFailedError>(),
    )?;
    m.add("UCXNoDeviceError", py.get_type::<UCXNoDeviceError>())?;
    m.add("UCXBusyError", py.get_type::<UCXBusyError>())?;
    m.add(
        "UCXShmemSegmentError",
        py.get_type::<UCXShmemSegmentError>(),
    )?;
    m.add(
        "UCXAlreadyExistsError",
        py.get_type::<UCXAlreadyExistsError>(),
    )?;
    m.add("UCXOutOfRangeError", py.get_type::<UCXOutOfRangeError>())?;
    m.add(
        "UCXExceedsLimitError",
        py.get_type::<UCXExceedsLimitError>(),
    )?;
    m.add("UCXUnsupportedError", py.get_type::<UCXUnsupportedError>())?;
    m.add("UCXRejectedError", py.get_type::<UCXRejectedError>())?;
    m.add(
        "UCXFirstLinkFailureError",
        py.get_type::<UCXFirstLinkFailureError>(),
    )?;
    m.add(
        "UCXLastLinkFailureError",
        py.get_type::<UCXLastLinkFailureError>(),
    )?;
    m.add(
        "UCXFirstEndpointFailureError",
        py.get_type::<UCXFirstEndpointFailureError>(),
    )?;
    m.add(
        "UCXEndpointTimeoutError",
        py.get_type::<UCXEndpointTimeoutError>(),
    )?;
    m.add(
        "UCXLastEndpointFailureError",
        py.get_type::<UCXLastEndpointFailureError>(),
    )?;
    // UCXX's aliases.
    m.add("UCXCanceled", py.get_type::<UCXCanceledError>())?;
    m.add("UCXMsgTruncated", py.get_type::<UCXMessageTruncatedError>())?;
    Ok(())
}
