/* The pod sandbox's "pause" process for the node tier (scripts/node/images.sh builds it
 * with gcc -static into a FROM-scratch image; no registry is reachable for the usual
 * registry.k8s.io/pause). It holds the pod's namespaces, reaps orphans (it is PID 1
 * when the pod shares its PID namespace) and exits on SIGINT/SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, quit);
  signal(SIGTERM, quit);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
