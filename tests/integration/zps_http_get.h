/* zps_http_get.h - the integration tests' HTTP client: one GET of
 * zps-server --http on loopback (check_http.c, check_clip.c). */
#ifndef ZPS_HTTP_GET_H
#define ZPS_HTTP_GET_H

// GET path from 127.0.0.1:port, waiting at most 2 s for each read: the
// body of a 200 answer (caller frees), or NULL (no answer, another status).
char *zps_http_get(int port, const char *path);

#endif
