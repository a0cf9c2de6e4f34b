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

/* ucs_config_parser_print_all_opts is UCS's, not part of UCP's stable API: UCX 1.19 gave it a
 * fifth argument (`filter`). A build against one UCX runs on a newer one (a from-source build
 * on Debian's 1.13 runs on the libucx wheel's 1.22 once that is installed), so the signature is
 * chosen by the version of the library loaded, not by the headers: calling the five-argument
 * function with four would pass garbage as its filter. */
typedef void (*ucxrs_print_opts4_t)(FILE *, const char *, ucs_config_print_flags_t,
                                    ucs_list_link_t *);
typedef void (*ucxrs_print_opts5_t)(FILE *, const char *, ucs_config_print_flags_t,
                                    ucs_list_link_t *, const char *);

void ucxrs_print_all_opts(FILE *stream, const char *prefix, ucs_config_print_flags_t flags)
{
    unsigned major, minor, release;
    /* Through a generic function pointer: converting between function pointer types is
     * defined, and each call below goes through the type of the function the loaded library
     * really has. */
    void (*fn)(void) = (void (*)(void))ucs_config_parser_print_all_opts;

    ucp_get_version(&major, &minor, &release);
    if ((major > 1) || ((major == 1) && (minor >= 19))) {
        ((ucxrs_print_opts5_t)fn)(stream, prefix, flags, &ucs_config_global_list, NULL);
    } else {
        ((ucxrs_print_opts4_t)fn)(stream, prefix, flags, &ucs_config_global_list);
    }
}
