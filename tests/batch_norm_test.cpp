// batch_norm family tests (placeholder until the family lands).
#include <gtest/gtest.h>
