/* Status strings and the thread-local message of the last failure. */
#include <stdarg.h>
#include <stdio.h>

#include "common.h"

static _Thread_local char pa_error_message[512];

const char *pa_status_string(pa_status status) {
  switch (status) {
    case PA_OK: return "ok";
    case PA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case PA_ERR_UNSUPPORTED: return "unsupported";
    case PA_ERR_OUT_OF_RANGE: return "out of range";
    case PA_ERR_OUT_OF_MEMORY: return "out of memory";
  }
  return "unknown status";
}

const char *pa_last_error(void) { return pa_error_message; }

pa_status pa_fail(pa_status status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(pa_error_message, sizeof pa_error_message, fmt, args);
  va_end(args);
  return status;
}
