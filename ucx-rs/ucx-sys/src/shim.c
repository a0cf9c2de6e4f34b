#include "shim.h"

ucs_status_t ucxrs_init(const ucp_params_t *params, const ucp_config_t *config,
                        ucp_context_h *context_p)
{
    return ucp_init(params, config, context_p);
}

int ucxrs_ptr_is_err(const void *ptr) { return UCS_PTR_IS_ERR(ptr); }

int ucxrs_ptr_is_ptr(const void *ptr) { return UCS_PTR_IS_PTR(ptr); }

ucs_status_t ucxrs_ptr_status(const void *ptr) { return UCS_PTR_STATUS(ptr); }

ucp_datatype_t ucxrs_dt_make_contig(size_t elem_size) { return ucp_dt_make_contig(elem_size); }
