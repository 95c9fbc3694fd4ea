/* lineedit.h: a small line editor for chat's turns on a terminal
 * (lineedit.c). The terminal is in raw mode only while a line is read, and is
 * put back on every way out: Enter, Ctrl-C, Ctrl-D, exit() (die) and the
 * signals that end a program.
 */
#ifndef LINEEDIT_H
#define LINEEDIT_H

#include <stddef.h>

/* How lineedit_read ended. */
typedef enum {
    LINE_ENTERED,   // Enter: the line is in *line
    LINE_END,       // Ctrl-D on an empty line, or the terminal went away: end of input
    LINE_CANCELLED, // Ctrl-C: the line is dropped; *len says how long it was
} LineResult;

typedef struct {
    int fd;       // the terminal the line is drawn on: stdout, or stderr when stdout is not one
    char **lines; // the lines entered so far, oldest first (Up and Down bring them back; owned)
    int n, cap;
} LineEditor;

/* The terminal a line editor can draw on, or -1 for none: stdin must be a
 * terminal that takes cursor escapes (TERM is not "dumb"); the editor draws on
 * stdout when it is a terminal, else on stderr when that is one. */
int lineedit_terminal(void);
/* Print prompt on ed->fd and read one line from stdin with editing, at most
 * max_bytes bytes (a key that would make it longer rings the bell).
 * LINE_ENTERED: *line is a new NUL-terminated string of *len bytes, also kept
 * for Up/Down when it is not empty; otherwise *line is NULL. stdout is
 * flushed first. */
LineResult lineedit_read(LineEditor *ed, const char *prompt, size_t max_bytes, char **line, size_t *len);
void lineedit_free(LineEditor *ed);

#endif
