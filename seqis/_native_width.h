/* seqis/_native_width.h: the passes of seqis/_native.c at one register width (W, TAG and TARGET defined before
   it), for float32 and float64 batches: _native_body.h once for each. */
#define FT float
#define IS_FLOAT 1
#include "_native_body.h"
#undef FT
#undef IS_FLOAT
#define FT double
#define IS_FLOAT 0
#include "_native_body.h"
#undef FT
#undef IS_FLOAT
#undef W
#undef TAG
#undef TARGET
