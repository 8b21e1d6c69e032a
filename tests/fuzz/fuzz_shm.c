/* fuzz_shm.c — libFuzzer target: the shared-memory reader stagehand-top
 * uses, on corrupt and truncated segments. Each input is written to a
 * scratch file (the reader refuses symbolic links such as /proc/self/fd). */
#include "telemetry/telemetry.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/stagehand-fuzz-shm.%d", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return 0;
    ssize_t w = write(fd, data, size);
    close(fd);
    struct sh_tm_reader *r = NULL;
    if (w == (ssize_t)size && sh_tm_open_path(path, &r, err, sizeof err) == 0) {
        static struct sh_tm_snapshot snap;
        sh_tm_read(r, &snap);
        (void)sh_tm_reader_stale(r);
        sh_tm_close(r);
    }
    unlink(path);
    return 0;
}
