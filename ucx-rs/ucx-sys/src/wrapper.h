#include <ucp/api/ucp.h>
#include <ucs/config/parser.h>
#include "shim.h"
