/* messages.h: the program's messages and its output on stdout (messages.c):
 * exit codes, die and notice for one-line messages on stderr, out_write and
 * out_printf for output that may end in a partial line, and a clock.
 */
#ifndef MESSAGES_H
#define MESSAGES_H

#include <stddef.h>

/* Exit codes: 0 ok, 1 = bad input or runtime failure, 2 = bad usage. */
enum { EXIT_BAD_INPUT = 1, EXIT_USAGE = 2 };

/* stdout through these remembers whether its last byte ended a line; the
 * code that can leave a partial line of output writes with them. */
void out_write(const char *bytes, size_t n);
void out_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The open line was ended by a terminal's echo of the user's Enter. */
void out_line_ended(void);
/* Print one line to stderr; if stdout left a partial line where stderr lands
 * (one terminal, pipe or file), end it there first. */
void notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same, then exit with `code`. */
void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
#ifdef FUZZING
#include <setjmp.h>
extern jmp_buf *die_jump; // a fuzz target's landing point (tests/fuzz): die returns there instead of exiting
#endif
/* Flush stdout; exit with a message if a write to it failed. */
void flush_stdout(void);
double now_seconds(void);

#endif
