#include <ucp/api/ucp.h>
#include "shim.h"
