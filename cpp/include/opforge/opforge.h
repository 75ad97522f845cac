// Everything a C++ kernel library needs from opforge.
#pragma once

#include "opforge/error.h"
#include "opforge/handles.h"
#include "opforge/library.h"
#include "opforge/schema.h"
#include "opforge/spec.h"
#include "opforge/structs.h"
#include "opforge/tags.h"
