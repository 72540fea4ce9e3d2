// pagewise: what the mixture-of-experts kernels (moe_route.cu, moe.cu) agree on.
#pragma once

// The most experts a token may choose: the routing writes up to this many, the down projection
// keeps as many ids and weights in shared memory.
constexpr int kMaxTopK = 16;
