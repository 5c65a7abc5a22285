/* The key that signs this daemon's unique ids, kept where a restarted
 * daemon finds it again (docs/restart.md): ids issued before a restart stay
 * valid, so jobs rejoin their comms by them. The file is the daemon's own:
 * a regular file of its uid, readable and writable by it alone, of exactly
 * the key's size, never followed through a link; anything else is refused
 * and a key of this run alone is used (its ids then end with it). Nothing a
 * tenant can write is read: the directory is the daemon's (the unit's
 * RuntimeDirectory), or next to the socket. The key lives in memory only
 * (tmpfs under /run): a reboot ends every job anyway. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "front/front.h"

static int read_key(int fd, const char *path, uint8_t *key, size_t len, char *why, size_t whylen) {
  struct stat st;
  if (fstat(fd, &st)) {
    snprintf(why, whylen, "%s: %s", path, strerror(errno));
    return -1;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) ||
      st.st_size != (off_t)len) {
    snprintf(why, whylen, "%s is not a %zu-byte file of uid %d readable by it alone", path, len,
             (int)geteuid());
    return -1;
  }
  ssize_t n = pread(fd, key, len, 0);
  if (n != (ssize_t)len) {
    snprintf(why, whylen, "%s: short read", path);
    return -1;
  }
  return 0;
}

int ccsd_id_key_load(const char *path, uint8_t *key, size_t len, int *ret_made, char *why,
                     size_t whylen) {
  *ret_made = 0;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    int rc = read_key(fd, path, key, len, why, whylen);
    close(fd);
    return rc;
  }
  if (errno != ENOENT) {
    snprintf(why, whylen, "%s: %s", path, strerror(errno));
    return -1;
  }
  randombytes_buf(key, len);
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(why, whylen, "cannot create %s: %s", path, strerror(errno));
    return -1;
  }
  ssize_t n = write(fd, key, len);
  int bad = n != (ssize_t)len || fsync(fd);
  if (close(fd) || bad) {
    snprintf(why, whylen, "cannot write %s", path);
    unlink(path);
    return -1;
  }
  *ret_made = 1;
  return 0;
}
