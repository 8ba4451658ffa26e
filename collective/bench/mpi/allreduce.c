/* The Open MPI side of `allreduce-bench --compare-mpi`: MPI_Allreduce (sum of floats) timed as the bench times
 * its own ranks, so the two can stand side by side in one run. Arguments: one `<bytes>:<iters>:<warmup>` per
 * size. For each size every rank runs the warm-up calls, meets the others in a barrier, times `iters` calls,
 * and rank 0 prints one JSON line: {"bytes":..,"iters":..,"time_us":..} with rank 0's mean time per call, as
 * `allreduce-bench` reports rank 0's. Exits 2 on a bad argument. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int a = 1; a < argc; a++) {
        long bytes = 0, iters = 0, warmup = 0;
        if (sscanf(argv[a], "%ld:%ld:%ld", &bytes, &iters, &warmup) != 3 || bytes < 4 || bytes % 4 != 0 ||
            iters < 1 || warmup < 0) {
            if (rank == 0) fprintf(stderr, "allreduce: bad size spec %s (want bytes:iters:warmup)\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        long count = bytes / 4;
        float *buf = malloc(bytes);
        if (buf == NULL) MPI_Abort(MPI_COMM_WORLD, 2);
        for (long i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        for (long i = 0; i < warmup; i++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double start = MPI_Wtime();
        for (long i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mean = (MPI_Wtime() - start) / (double)iters;
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"bytes\":%ld,\"iters\":%ld,\"time_us\":%.3f}\n", bytes, iters, mean * 1e6);
            fflush(stdout);
        }
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
