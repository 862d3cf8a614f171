/* The sandbox's first process: it holds the pod's namespaces open, reaps orphans that land on it (it is PID 1 of
 * the pod when the pod shares its process namespace) and exits on SIGINT or SIGTERM, as Kubernetes' pause does. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal_number) { _exit(0); }

static void reap(int signal_number) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        return 2;
    }
    for (;;) {
        pause();
    }
}
