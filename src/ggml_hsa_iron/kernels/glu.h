// glu.h: the GLU op of a core build, act(x) * g (ggml_aie.h's functions), picked by the
// plan's define: GGML_OP_REGLU, GGML_OP_GEGLU, GGML_OP_SWIGLU, GGML_OP_GEGLU_ERF or
// GGML_OP_GEGLU_QUICK. Included by eltwise.cc (the GLU ops, -DGLU=1) and by mv.cc and mvq.cc
// (the fused MUL_MAT_<glu> GEMVs, -DMV_GLU=1). Not in ggml_aie.h: that header is precompiled
// without the op's defines.

#ifndef GGML_GLU_H
#define GGML_GLU_H

#include "ggml_aie.h"

#if defined(GGML_OP_REGLU)
static inline ggml_aie::vf glu_op(ggml_aie::vf x, ggml_aie::vf g) { return ggml_aie::reglu(x, g); }
#elif defined(GGML_OP_GEGLU)
static inline ggml_aie::vf glu_op(ggml_aie::vf x, ggml_aie::vf g) { return ggml_aie::geglu(x, g); }
#elif defined(GGML_OP_SWIGLU)
static inline ggml_aie::vf glu_op(ggml_aie::vf x, ggml_aie::vf g) { return ggml_aie::swiglu(x, g); }
#elif defined(GGML_OP_GEGLU_ERF)
static inline ggml_aie::vf glu_op(ggml_aie::vf x, ggml_aie::vf g) {
  return ggml_aie::geglu_erf(x, g);
}
#elif defined(GGML_OP_GEGLU_QUICK)
static inline ggml_aie::vf glu_op(ggml_aie::vf x, ggml_aie::vf g) {
  return ggml_aie::geglu_quick(x, g);
}
#else
#error "glu.h: define one GGML_OP_<glu op>"
#endif

#endif
