// The opforge version these headers belong to. A kernel library records it
// when it is built; the core compares it with its own when the library loads.
#pragma once

#define OPFORGE_VERSION_STRING "0.1.0"
