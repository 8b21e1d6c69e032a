/* graph.h — what the library learns of executable graphs (graph.c), for
 * the hooks that see the program make, change and destroy them
 * (graphexec.c).
 */
#ifndef SH_INTERPOSE_GRAPH_H
#define SH_INTERPOSE_GRAPH_H

#include "interpose/interpose.h"

#define SH_GRAPH_NODE_ADDRS 256 /* what one kernel node's parameters can name */

/* Learns the regions exec's nodes touch, as graph's nodes are now. */
void sh_graph_learn(CUgraphExec exec, CUgraph graph);
void sh_graph_forget(CUgraphExec exec);
/* New parameters of one node of exec: what they touch joins what exec is
 * known to touch; what they may reach through tables is not followed, so
 * exec counts as opaque from then on. */
void sh_graph_learn_more(CUgraphExec exec, const uintptr_t *addrs, size_t n);

/* The first and last byte of a pitched range starting at base (0 if none). */
size_t sh_graph_span(uintptr_t base, size_t off, size_t pitch, size_t rows, size_t width,
                     size_t height, size_t depth, uintptr_t *out);
/* What a node's parameters touch, into addrs[0..max): their count. */
size_t sh_graph_memset_addrs(const CUDA_MEMSET_NODE_PARAMS *p, uintptr_t *addrs, size_t max);
size_t sh_graph_memcpy_addrs(const CUDA_MEMCPY3D *p, uintptr_t *addrs, size_t max);
size_t sh_graph_kernel_addrs(const CUDA_KERNEL_NODE_PARAMS *p, uintptr_t *addrs, size_t max,
                             struct sh_node_scan *ns);

#endif
