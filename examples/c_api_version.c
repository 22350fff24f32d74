/* Links the C API from plain C: prints the library version and what a bad spec reports. */
#include <stdio.h>

#include "reshard/reshard_c.h"

int main(void) {
  reshard_spec_t* spec = NULL;
  reshard_status_t st = reshard_spec_from_json("{\"tensors\": [], \"placement\": 1}", &spec);
  printf("reshard %s; misspelt spec -> status %d: %s\n", reshard_version(), (int)st,
         reshard_last_error());
  reshard_spec_destroy(spec);
  return st == RESHARD_INVALID_ARGUMENT ? 0 : 1;
}
