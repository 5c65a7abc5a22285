#include "addr.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Splits "HOST:PORT" / "[HOST]:PORT" into host and port; -1 when malformed. */
static int split(const char *s, char *host, size_t hostlen, unsigned *port) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
      strlen(colon + 1) > 5)
    return -1;
  unsigned long p = strtoul(colon + 1, NULL, 10);
  if (p > 65535) return -1;
  const char *h = s;
  size_t n = (size_t)(colon - s);
  if (s[0] == '[') {
    if (n < 2 || s[n - 1] != ']') return -1;
    h++, n -= 2;
  }
  if (n == 0 || n >= hostlen) return -1;
  memcpy(host, h, n);
  host[n] = 0;
  *port = (unsigned)p;
  return 0;
}

int ccs_addr_parse(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len) {
  char host[64];
  unsigned port;
  if (!s || split(s, host, sizeof(host), &port)) return -1;
  memset(ret, 0, sizeof(*ret));
  struct sockaddr_in *v4 = (struct sockaddr_in *)ret;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ret;
  if (s[0] != '[' && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    *ret_len = sizeof(*v4);
    return 0;
  }
  if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    *ret_len = sizeof(*v6);
    return 0;
  }
  return -1;
}

int ccs_addr_is_numeric(const char *s) {
  struct sockaddr_storage ss;
  socklen_t len;
  return ccs_addr_parse(s, &ss, &len) == 0;
}

void ccs_addr_format(const struct sockaddr *sa, socklen_t len, char *out, size_t outlen) {
  char host[INET6_ADDRSTRLEN] = "?", port[8] = "0";
  getnameinfo(sa, len, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  snprintf(out, outlen, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

int ccs_addr_resolve(const char *s, char *out, size_t outlen, char *err, size_t errlen) {
  char host[256];
  unsigned port;
  if (split(s, host, sizeof(host), &port)) {
    snprintf(err, errlen, "'%s' is not HOST:PORT", s);
    return -1;
  }
  char service[8];
  snprintf(service, sizeof(service), "%u", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
  int rc = getaddrinfo(host, service, &hints, &ai);
  if (rc) {
    snprintf(err, errlen, "%s: %s", s, gai_strerror(rc));
    return -1;
  }
  ccs_addr_format(ai->ai_addr, ai->ai_addrlen, out, outlen);
  freeaddrinfo(ai);
  return 0;
}
