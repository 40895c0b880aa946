// Must NOT compile: the model part does not link the transport, so its headers are not visible.
#include "transport/transport.h"

int layering_model_includes_transport() { return 0; }
