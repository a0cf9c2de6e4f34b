/* What bindgen cannot see: UCS_PTR_* macros, ucp_dt_make_contig and the static inline ucp_init. */
#ifndef UCXRS_SHIM_H
#define UCXRS_SHIM_H
#include <ucp/api/ucp.h>

ucs_status_t ucxrs_init(const ucp_params_t *params, const ucp_config_t *config,
                        ucp_context_h *context_p);
int ucxrs_ptr_is_err(const void *ptr);
int ucxrs_ptr_is_ptr(const void *ptr);
ucs_status_t ucxrs_ptr_status(const void *ptr);
ucp_datatype_t ucxrs_dt_make_contig(size_t elem_size);
/* Every option of UCX and its loaded modules (ucx_info -c), whichever parser signature this
 * UCX has. */
void ucxrs_print_all_opts(FILE *stream, const char *prefix, ucs_config_print_flags_t flags);

#endif
