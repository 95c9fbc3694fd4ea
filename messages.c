/* messages.c: the program's messages and its output on stdout.
 *
 * The loader and the builder report a bad input by returning a negative code
 * with a one-line message in an err buffer (model.h's fail), so that the tests
 * can call them; the modes and main print such a message and exit with die(),
 * and so do the few steps that cannot go on (out of memory, a forward step
 * that failed). A message never lands in the middle of a line of output
 * (out_write, notice). messages.h declares what is here.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "messages.h"

#ifdef FUZZING
jmp_buf *die_jump;
#endif

/* stdout carries the output (the generated text, a table, JSON) and stderr
 * the messages; on a terminal, or with 2>&1, the two land in one place. A
 * message printed while stdout holds a partial line would be glued to it
 * ("...on one corner andgenerate: the context ..."), so every message that can
 * follow output starts a line of its own: the code that writes a partial line
 * to stdout (generated text, chat's labels, passkey's rows and JSON) writes
 * through out_write or out_printf, which remember whether the last byte ended a
 * line, and a message (notice, die) first ends that line. The newline goes to
 * stderr, never to stdout, so that stdout's bytes stay exactly the output (a
 * file of generated text gets no newline it did not generate), and only when
 * stdout and stderr are one file (the same terminal, pipe or file): written
 * apart, stderr gets no blank line. Output that is printed after the last
 * message (ppl's report, tokenize's ids, -m rope) needs no tracking. */
static int stdout_line_open; // out_write left a partial line that no newline (on stdout, or before a
                             // message on stderr) has ended yet

/* Write n bytes to stdout, remembering whether they end a line. */
void out_write(const char *bytes, size_t n) {
    if (n == 0) return;
    fwrite(bytes, 1, n, stdout);
    stdout_line_open = bytes[n - 1] != '\n';
}

/* printf to stdout, remembering whether the text ends a line. */
void out_printf(const char *fmt, ...) {
    char small[256], *text = small;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small) { // longer: format it again into a buffer of its size
        text = malloc((size_t)n + 1);
        if (!text) die(EXIT_BAD_INPUT, "out of memory");
        vsnprintf(text, (size_t)n + 1, fmt, again);
    }
    va_end(again);
    if (n > 0) out_write(text, (size_t)n);
    if (text != small) free(text);
}

/* The open line ended without a byte from this program: a terminal's echo of
 * the Enter that ended the user's line (chat). */
void out_line_ended(void) { stdout_line_open = 0; }

/* Whether stdout and stderr are one file (one terminal, one pipe, one file, as
 * 2>&1 makes them), where their bytes interleave. */
static int stdout_is_stderr(void) {
    struct stat out, err;
    return fstat(STDOUT_FILENO, &out) == 0 && fstat(STDERR_FILENO, &err) == 0 && out.st_dev == err.st_dev &&
           out.st_ino == err.st_ino;
}

/* Write text to stderr with each control byte escaped (\n, \r, \t, \xHH):
 * whatever a message quotes (a path, a flag's value, bytes of a file), it
 * stays one line. The call sites show paths with shown_path (model.h), in
 * quotes; this is the guarantee under them. */
static void put_one_line(const char *text) {
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p >= 0x20 && *p != 0x7f) fputc(*p, stderr);
        else if (*p == '\n') fputs("\\n", stderr);
        else if (*p == '\r') fputs("\\r", stderr);
        else if (*p == '\t') fputs("\\t", stderr);
        else fprintf(stderr, "\\x%02X", *p);
    }
}

/* One message line on stderr, starting a line of its own: stdout's pending
 * bytes go first (fflush; a failure stays in ferror for flush_stdout to
 * report), then a newline on stderr if they left a line open where stderr
 * lands, then the message, kept on one line (put_one_line). */
static void message_line(const char *fmt, va_list ap) {
    fflush(stdout);
    if (stdout_line_open && stdout_is_stderr()) fputc('\n', stderr);
    stdout_line_open = 0;
    char small[1024], *text = small;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= (int)sizeof small && (text = malloc((size_t)n + 1)) != NULL) vsnprintf(text, (size_t)n + 1, fmt, again);
    va_end(again);
    put_one_line(text ? text : small); // out of memory: the message's first 1023 bytes
    if (text != small) free(text);
    fputc('\n', stderr);
}

/* Print one line to stderr (message_line): the notices a run prints beside
 * its output (a full context, a cell's result, a note). */
void notice(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    message_line(fmt, ap);
    va_end(ap);
}

/* Print one line to stderr (message_line) and exit with `code`. Every message
 * names the file or flag at fault and what was expected; nothing is printed
 * to stdout. */
void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    message_line(fmt, ap);
    va_end(ap);
#ifdef FUZZING
    if (die_jump) longjmp(*die_jump, code);
#endif
    exit(code);
}

/* Flush stdout and exit with a one-line message if a write to it failed (a
 * full disk, /dev/full): output that was lost is a failure, never exit 0. A
 * reader that closed a pipe ends the program at once instead, quietly, by
 * SIGPIPE's default action, as for cat or grep. */
void flush_stdout(void) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        die(EXIT_BAD_INPUT, "stdout: write failed: %s", errno ? strerror(errno) : "output error");
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
