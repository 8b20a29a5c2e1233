/*
 * dist.h — the agreement board of k3.dist (lib/dist.c), shared by the process group and the
 * Lua binding's simulated worlds (lib/lua/dist.c). Before each collective every rank posts
 * the call's signature (call, dtype, shape: host metadata only) to a board that every rank
 * reads; when all have posted, each compares them and, on a difference, raises the same
 * message naming every rank's call. Nothing of it touches a device or a stream.
 *
 * Between processes the board is a file in the launcher's directory mapped MAP_SHARED (so
 * every rank runs on one host, which `scripts/k3 --nproc` guarantees); in one process
 * (k3.dist.simulate) it is plain memory. Two slots per rank, used by the parity of the
 * rank's collective count: a rank can only post collective n + 2 after every rank posted
 * n + 1, which each does only after reading collective n, so a slot is never overwritten
 * while a peer still reads it.
 */
#ifndef K3_DIST_H
#define K3_DIST_H

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The calls a signature names. */
enum { K3_DIST_CALL_ALL_REDUCE_SUM = 1, K3_DIST_CALL_ALL_REDUCE_MAX, K3_DIST_CALL_ALL_REDUCE_MIN,
       K3_DIST_CALL_ALL_GATHER, K3_DIST_CALL_BARRIER };

typedef struct k3_dist_board k3_dist_board;

/* A board for `world` ranks in this process's memory (world in 1..4096, else K3_EINVAL;
 * K3_ENOMEM). Free with k3_dist_board_free. */
K3_API k3_status k3_dist_board_new(k3_dist_board **out, int world);
K3_API void k3_dist_board_free(k3_dist_board *b);

/* The board of a world of processes: a file of `path` mapped MAP_SHARED. Rank 0 creates it
 * (the process group does so before it writes the NCCL id); the other ranks open it after,
 * and fail (K3_EIO) when it is not this world's, or (K3_EINVAL) when rank 0 wrote another
 * host's name in it. */
K3_API k3_status k3_dist_board_open(k3_dist_board **out, const char *path, int rank, int world);

/* Posts `rank`'s signature for its next collective: call (K3_DIST_CALL_*), and t's dtype and
 * shape (t NULL for a barrier). A rank that posts again before its verdict is K3_EINVAL. */
K3_API k3_status k3_dist_board_post(k3_dist_board *b, int rank, int call, const k3_tensor *t);

/* 1 when every rank has posted the collective `rank` last posted, else 0; -1 when `rank`
 * has nothing posted. `missing` (may be NULL) gets the ranks not there yet, as "1, 3". */
K3_API int k3_dist_board_ready(const k3_dist_board *b, int rank, char *missing, size_t n);

/* Tells the other ranks why `rank` gives up: "rank R: msg" as the first line of failed_file
 * (nothing when it is NULL or empty). The note is written to a temporary file and linked into
 * place, so a reader sees it whole or not at all, and the first note wins (a later link fails
 * on the existing file); a file system without hard links gets it written in place (O_EXCL).
 * Used by the board's waits and by the CUDA backend's. */
K3_API void k3_dist_note_failure(const char *failed_file, int rank, const char *msg);

/* Waits on the host until the board is ready for `rank`'s posted call: spins, then sleeps in
 * growing steps. Bounded: after timeout_s seconds K3_ECUDA "k3.dist.<what>: rank R timed out
 * after T s waiting for the other ranks to make the same call (not there: rank 1; ...)",
 * written first to failed_file (may be NULL) so the other ranks stop at once; and when
 * failed_file appears (the launcher's note of a failed rank, or a peer's) K3_ECUDA
 * "k3.dist.<what>: rank R stops: <its first line>". */
K3_API k3_status k3_dist_board_wait(k3_dist_board *b, int rank, const char *what,
                                    double timeout_s, const char *failed_file);

/* Once ready: K3_OK when every rank posted the same signature, else K3_ESHAPE with
 * "k3.dist.<what>: the ranks' calls differ (...): rank 0: all_reduce(sum) of bf16 [2, 8];
 * rank 1: ..." (the same text on every rank but for `what`). Ends `rank`'s check either way;
 * not ready is K3_EINVAL. */
K3_API k3_status k3_dist_board_verdict(k3_dist_board *b, int rank, const char *what);

/* Collectives `rank` has checked on this board. */
K3_API uint64_t k3_dist_board_checks(const k3_dist_board *b, int rank);

/* k3_dist_explain's decision for a world of `world` ranks; simulated: the ranks are
 * k3.dist.simulate's coroutines (chosen "simulate.all_reduce", the in-process reference). */
K3_API k3_status k3_dist_decide(k3_dispatch *rec, const char *collective, const k3_tensor *t,
                                int world, int simulated);

#ifdef __cplusplus
}
#endif
#endif
