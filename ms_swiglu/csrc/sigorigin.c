/* Tells a SIGTERM that the process sent itself apart from one sent from outside.
 *
 * MindSpore replaces the SIGINT handler at each graph call with one that does kill(getpid(), SIGTERM), so after
 * a graph call Ctrl-C reaches Python as SIGTERM. This handler, put in front of Python's own for SIGTERM, notes
 * a SIGTERM whose sender is this process (kill(2): SI_USER, si_pid == getpid()) and passes every SIGTERM on to
 * Python's handler. Loaded with ctypes by ms_swiglu/signals.py; no Python API. */
#include <signal.h>
#include <string.h>
#include <unistd.h>

static struct sigaction next_handler;
static volatile sig_atomic_t self_sent;

static void on_term(int signo, siginfo_t *info, void *context) {
    if (info != NULL && info->si_code == SI_USER && info->si_pid == getpid()) self_sent = 1;
    if (next_handler.sa_flags & SA_SIGINFO) {
        next_handler.sa_sigaction(signo, info, context);
    } else if (next_handler.sa_handler != SIG_DFL && next_handler.sa_handler != SIG_IGN) {
        next_handler.sa_handler(signo);
    }
}

/* Put on_term in front of the SIGTERM handler installed now (Python's); 0 on success. */
int ms_swiglu_sigorigin_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_term;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGTERM, &sa, &next_handler);
}

/* 1 if a SIGTERM since the last call came from this process itself; clears the note. */
int ms_swiglu_sigorigin_take(void) {
    int was = self_sent;
    self_sent = 0;
    return was;
}
