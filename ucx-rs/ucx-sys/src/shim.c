#include "shim.h"
#include <ucs/config/parser.h>

ucs_status_t ucxrs_init(const ucp_params_t *params, const ucp_config_t *config,
                        ucp_context_h *context_p)
{
    return ucp_init(params, config, context_p);
}

int ucxrs_ptr_is_err(const void *ptr) { return UCS_PTR_IS_ERR(ptr); }

int ucxrs_ptr_is_ptr(const void *ptr) { return UCS_PTR_IS_PTR(ptr); }

ucs_status_t ucxrs_ptr_status(const void *ptr) { return UCS_PTR_STATUS(ptr); }

ucp_datatype_t ucxrs_dt_make_contig(size_t elem_size) { return ucp_dt_make_contig(elem_size); }

void ucxrs_print_all_opts(FILE *stream, const char *prefix, ucs_config_print_flags_t flags)
{
#ifdef UCXRS_PRINT_ALL_OPTS_FILTER
    ucs_config_parser_print_all_opts(stream, prefix, flags, &ucs_config_global_list, NULL);
#else
    ucs_config_parser_print_all_opts(stream, prefix, flags, &ucs_config_global_list);
#endif
}
