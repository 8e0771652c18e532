/* Private POSIX shared memory and named semaphores for confined code (LD_PRELOAD).
 *
 * glibc's shm_open/shm_unlink and sem_open/sem_unlink keep their objects in /dev/shm,
 * with no way to point them elsewhere. /dev/shm is shared by every conversation of a
 * sandbox, so Landlock denies it to executed code — and multiprocessing's locks, queues
 * and pools, multiprocessing.shared_memory, joblib and everything built on them fail.
 * This library, preloaded into every code process, puts those objects in the directory
 * named by SBW_SHM_DIR (the conversation's private scratch space, deleted with it):
 *   shm_open("/x")  -> $SBW_SHM_DIR/x        sem_open("/x") -> $SBW_SHM_DIR/sem.x
 * The same files glibc would make, in a place only this conversation can reach (Landlock
 * grants no other conversation that directory), so no channel between conversations.
 * sem_open builds the semaphore as glibc does: sem_init(pshared) into a temporary file,
 * link() to the name (atomic: no one sees a half-written semaphore), mmap. SBW_SHM_DIR is
 * read once at load; unset, every call goes to glibc unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static char shm_dir[PATH_MAX];

__attribute__((constructor)) static void sbw_init(void) {
    const char *dir = getenv("SBW_SHM_DIR");
    if (dir != NULL && dir[0] == '/' && strlen(dir) < sizeof(shm_dir) - NAME_MAX - 8)
        strcpy(shm_dir, dir);
}

/* "$dir/<prefix><name>" for a POSIX name ("/x" or "x", no other slash). */
static int object_path(const char *name, const char *prefix, char *out) {
    while (*name == '/')
        name++;
    size_t len = strlen(name);
    if (len == 0 || strchr(name, '/') != NULL || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0) {
        errno = EINVAL;
        return -1;
    }
    if (len + strlen(prefix) > NAME_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (mkdir(shm_dir, 0700) != 0 && errno != EEXIST)
        return -1;
    snprintf(out, PATH_MAX, "%s/%s%s", shm_dir, prefix, name);
    return 0;
}

int shm_open(const char *name, int oflag, mode_t mode) {
    if (!shm_dir[0]) {
        int (*real)(const char *, int, mode_t) = dlsym(RTLD_NEXT, "shm_open");
        return real(name, oflag, mode);
    }
    char path[PATH_MAX];
    if (object_path(name, "", path) != 0)
        return -1;
    return open(path, oflag | O_NOFOLLOW | O_CLOEXEC, mode);
}

int shm_unlink(const char *name) {
    if (!shm_dir[0]) {
        int (*real)(const char *) = dlsym(RTLD_NEXT, "shm_unlink");
        return real(name);
    }
    char path[PATH_MAX];
    if (object_path(name, "", path) != 0)
        return -1;
    return unlink(path);
}

static sem_t *map_semaphore(int fd) {
    void *sem = mmap(NULL, sizeof(sem_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int saved = errno;
    close(fd);
    errno = saved;
    return sem == MAP_FAILED ? SEM_FAILED : (sem_t *)sem;
}

/* A new semaphore at ``path``: 0 and *fd set, or -1 (errno EEXIST when it exists). */
static int create_semaphore(const char *path, mode_t mode, unsigned value, int *fd) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s/.sem.XXXXXX", shm_dir);
    int f = mkostemp(tmp, O_CLOEXEC);
    if (f < 0)
        return -1;
    sem_t initial;
    memset(&initial, 0, sizeof(initial));
    if (sem_init(&initial, 1, value) != 0 || fchmod(f, mode & 0777) != 0 ||
        write(f, &initial, sizeof(initial)) != (ssize_t)sizeof(initial) ||
        link(tmp, path) != 0) {
        int saved = errno;
        unlink(tmp);
        close(f);
        errno = saved;
        return -1;
    }
    unlink(tmp);
    *fd = f;
    return 0;
}

sem_t *sem_open(const char *name, int oflag, ...) {
    mode_t mode = 0;
    unsigned value = 0;
    if (oflag & O_CREAT) {
        va_list args;
        va_start(args, oflag);
        mode = va_arg(args, mode_t);
        value = va_arg(args, unsigned);
        va_end(args);
    }
    if (!shm_dir[0]) {
        sem_t *(*real)(const char *, int, ...) = dlsym(RTLD_NEXT, "sem_open");
        return (oflag & O_CREAT) ? real(name, oflag, mode, value) : real(name, oflag);
    }
    if ((oflag & O_CREAT) && value > SEM_VALUE_MAX) {
        errno = EINVAL;
        return SEM_FAILED;
    }
    char path[PATH_MAX];
    if (object_path(name, "sem.", path) != 0)
        return SEM_FAILED;
    for (int attempt = 0; attempt < 100; attempt++) {
        if (!(oflag & O_EXCL)) {
            int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0)
                return map_semaphore(fd);
            if (errno != ENOENT || !(oflag & O_CREAT))
                return SEM_FAILED;
        }
        int fd;
        if (create_semaphore(path, mode, value, &fd) == 0)
            return map_semaphore(fd);
        if (errno != EEXIST || (oflag & O_EXCL))
            return SEM_FAILED;
        /* Made by someone else between our open and our link: open theirs. */
    }
    errno = EAGAIN;
    return SEM_FAILED;
}

int sem_close(sem_t *sem) {
    if (!shm_dir[0]) {
        int (*real)(sem_t *) = dlsym(RTLD_NEXT, "sem_close");
        return real(sem);
    }
    return munmap(sem, sizeof(sem_t));
}

int sem_unlink(const char *name) {
    if (!shm_dir[0]) {
        int (*real)(const char *) = dlsym(RTLD_NEXT, "sem_unlink");
        return real(name);
    }
    char path[PATH_MAX];
    if (object_path(name, "sem.", path) != 0)
        return -1;
    return unlink(path);
}
