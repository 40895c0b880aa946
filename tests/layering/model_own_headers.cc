// Compiles: the model part includes its own headers and those of common/, which it links.
#include "common/status.h"
#include "model/config.h"

int layering_model_own_headers() { return 0; }
