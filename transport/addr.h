/* Daemon addresses as text: "ADDR:PORT" or "[V6ADDR]:PORT". Between
 * daemons only numeric addresses travel (a name is resolved once, where an
 * operator wrote it, never on a thread that serves others). */
#ifndef CCS_ADDR_H
#define CCS_ADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* 1 when s is a numeric address with a port, 0 otherwise. */
int ccs_addr_is_numeric(const char *s);
/* The socket address of a numeric s; -1 when it is not one. */
int ccs_addr_parse(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len);
/* HOST:PORT (a name, or numeric) to numeric text, resolving with the
 * system's resolver (blocks: at start only). */
int ccs_addr_resolve(const char *s, char *out, size_t outlen, char *err, size_t errlen);
/* The numeric text of a socket address. */
void ccs_addr_format(const struct sockaddr *sa, socklen_t len, char *out, size_t outlen);

#endif
