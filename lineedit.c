/* lineedit.c: a small line editor for chat on a terminal, in the manner of
 * linenoise: the terminal goes into raw mode (no echo, keys one by one) while
 * a line is read, and every key redraws the line.
 *
 *   Left, Right, Ctrl-B, Ctrl-F     move by one character (UTF-8 aware)
 *   Home, End, Ctrl-A, Ctrl-E       to the start, to the end
 *   Backspace, Delete, Ctrl-D       delete before / under the cursor
 *                                   (Ctrl-D on an empty line: end of input)
 *   Ctrl-U, Ctrl-K                  delete to the start / to the end
 *   Up, Down, Ctrl-P, Ctrl-N        the lines entered before in this session
 *   Ctrl-C                          drop the line (the caller decides what follows)
 *   Ctrl-Z                          suspend, as in a shell
 *   Enter                           the line is done
 *
 * A line longer than the terminal scrolls sideways around the cursor. Widths
 * are counted as one column per character: a line holding wide characters
 * (CJK, emoji) and longer than the terminal may put the cursor off. A tab is
 * taken as a space; other control keys are ignored.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "lineedit.h"
#include "run.h"

#define CONTROL(c) ((c) & 0x1f) // the byte Ctrl+c sends

/* ---- The terminal's modes ------------------------------------------------ */

static struct termios cooked;          // the modes to put back
static volatile sig_atomic_t raw_on;   // 1 while the terminal is in raw mode
/* Signals whose default action ends the program: while in raw mode, each
 * puts the terminal back first. (Ctrl-C and Ctrl-\ send none in raw mode;
 * these come from elsewhere, e.g. kill or a closed terminal.) */
static const int ENDING_SIGNALS[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define N_ENDING ((int)(sizeof ENDING_SIGNALS / sizeof ENDING_SIGNALS[0]))
static struct sigaction outside[N_ENDING]; // their actions outside raw mode

/* Put the terminal's modes back: at the end of a line, at exit (die), and in
 * a signal handler (tcsetattr is async-signal-safe). */
static void restore_terminal(void) {
    if (!raw_on) return;
    tcsetattr(STDIN_FILENO, TCSADRAIN, &cooked);
    raw_on = 0;
}

/* A signal that ends the program arrived in raw mode: the terminal goes back,
 * then the signal, now at its default action (SA_RESETHAND), ends the program
 * when the handler returns. */
static void end_by_signal(int sig) {
    restore_terminal();
    raise(sig);
}

/* Raw mode: keys arrive one by one, unechoed, Ctrl-C and Ctrl-Z as bytes;
 * output processing stays on ("\n" moves to the next line's start). Keys typed
 * before (during a reply) are kept. Exits with a message if the terminal
 * refuses. */
static void enter_raw_mode(void) {
    static int registered;
    if (tcgetattr(STDIN_FILENO, &cooked) != 0) die(EXIT_BAD_INPUT, "stdin: cannot read the terminal's modes: %s",
                                                   strerror(errno));
    if (!registered) registered = atexit(restore_terminal) == 0; // die() exits: the terminal goes back then
    struct sigaction sa = {0};
    sa.sa_handler = end_by_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_ENDING; i++) {
        sigaction(ENDING_SIGNALS[i], NULL, &outside[i]);
        if (outside[i].sa_handler == SIG_DFL) sigaction(ENDING_SIGNALS[i], &sa, NULL); // not one ignored or caught
    }
    struct termios raw = cooked;
    raw.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    raw.c_cflag |= CS8;
    raw.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    raw_on = 1;
    if (tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) != 0)
        die(EXIT_BAD_INPUT, "stdin: cannot put the terminal in raw mode: %s", strerror(errno));
}

static void leave_raw_mode(void) {
    restore_terminal();
    for (int i = 0; i < N_ENDING; i++) sigaction(ENDING_SIGNALS[i], &outside[i], NULL);
}

int lineedit_terminal(void) {
    const char *term = getenv("TERM");
    if (!isatty(STDIN_FILENO) || (term && !strcmp(term, "dumb"))) return -1;
    return isatty(STDOUT_FILENO) ? STDOUT_FILENO : isatty(STDERR_FILENO) ? STDERR_FILENO : -1;
}

/* ---- Keys ---------------------------------------------------------------- */

enum { KEY_GONE = -1, KEY_NONE = 0, KEY_TEXT = 256, KEY_UP, KEY_DOWN, KEY_LEFT, KEY_RIGHT, KEY_HOME, KEY_END,
       KEY_DELETE };

typedef struct {
    int code;      // a control byte (CONTROL('A') .. 127), KEY_* or KEY_TEXT
    char text[4];  // KEY_TEXT: one character, UTF-8
    int len;
} Key;

/* One byte from stdin; -1 when the terminal is gone (end of file, an error). */
static int read_byte(void) {
    unsigned char c;
    for (;;) {
        ssize_t n = read(STDIN_FILENO, &c, 1);
        if (n == 1) return c;
        if (n < 0 && errno == EINTR) continue;
        return -1;
    }
}

/* 1 when a byte can be read at once (the rest of a paste or of an escape). */
static int byte_waiting(int wait_ms) {
    struct pollfd p = {STDIN_FILENO, POLLIN, 0};
    return poll(&p, 1, wait_ms) == 1;
}

/* After ESC: the key of an escape sequence (ESC [ params final, or ESC O
 * final), or KEY_NONE for a lone ESC and for sequences the editor does not
 * use. Its bytes come together; 50 ms without one ends it. */
static int escape_key(void) {
    int c = byte_waiting(50) ? read_byte() : -1;
    if (c != '[' && c != 'O') return KEY_NONE;
    int first = 0, in_first = 1; // the first parameter: ESC [ 3 ~ is Delete
    while ((c = byte_waiting(50) ? read_byte() : -1) >= 0 && ((c >= '0' && c <= '9') || c == ';')) {
        if (c == ';') in_first = 0;
        else if (in_first && first < 1000) first = first * 10 + (c - '0');
    }
    switch (c) {
    case 'A': return KEY_UP;
    case 'B': return KEY_DOWN;
    case 'C': return KEY_RIGHT;
    case 'D': return KEY_LEFT;
    case 'H': return KEY_HOME;
    case 'F': return KEY_END;
    case '~': return first == 1 || first == 7 ? KEY_HOME : first == 4 || first == 8 ? KEY_END
                   : first == 3 ? KEY_DELETE : KEY_NONE;
    default: return KEY_NONE;
    }
}

/* The next key. A UTF-8 lead byte brings the bytes of its character; a
 * malformed character is KEY_NONE. */
static Key read_key(void) {
    Key k = {KEY_NONE, {0}, 0};
    int c = read_byte();
    if (c < 0) k.code = KEY_GONE;
    else if (c == 27) k.code = escape_key();
    else if (c == '\t') k.code = KEY_TEXT, k.text[0] = ' ', k.len = 1;
    else if (c < 0x20 || c == 127) k.code = c;
    else if (c < 0x80) k.code = KEY_TEXT, k.text[0] = (char)c, k.len = 1;
    else {
        int more = c >= 0xF0 && c <= 0xF7 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1; // 0x80..0xBF alone: none
        if (c > 0xF7) more = -1;
        if (more < 0) return k;
        k.text[k.len++] = (char)c;
        for (int i = 0; i < more; i++) {
            int b = byte_waiting(50) ? read_byte() : -1;
            if (b < 0x80 || b > 0xBF) return (Key){KEY_NONE, {0}, 0};
            k.text[k.len++] = (char)b;
        }
        k.code = KEY_TEXT;
    }
    return k;
}

/* ---- The line being edited ----------------------------------------------- */

typedef struct {
    char *buf;          // the text, NUL-terminated
    size_t len, cap;
    size_t pos;         // the cursor: a byte offset at a character's start
    size_t max_bytes;
    const char *prompt;
    int fd;             // the terminal drawn on
    int shown;          // which line of the history is shown; ed->n = the one being typed
    char *draft;        // the line being typed, kept while the history is shown
} Line;

static int is_continuation(char c) { return ((unsigned char)c & 0xC0) == 0x80; }
static size_t prev_char(const Line *l, size_t at) {
    do at--; while (at > 0 && is_continuation(l->buf[at]));
    return at;
}
static size_t next_char(const Line *l, size_t at) {
    do at++; while (at < l->len && is_continuation(l->buf[at]));
    return at;
}

/* Make room for `need` bytes and the NUL. */
static void reserve(Line *l, size_t need) {
    if (need + 1 <= l->cap) return;
    l->cap = 2 * (need + 1);
    l->buf = realloc(l->buf, l->cap);
    if (!l->buf) die(EXIT_BAD_INPUT, "stdin: out of memory for a line of %zu bytes", need);
}

static void write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; // a terminal that is gone: reading will say so
        s += w, n -= (size_t)w;
    }
}
static void write_str(int fd, const char *s) { write_all(fd, s, strlen(s)); }

static void insert(Line *l, const char *s, size_t n) {
    if (l->len + n > l->max_bytes) {
        write_str(l->fd, "\a");
        return;
    }
    reserve(l, l->len + n);
    memmove(l->buf + l->pos + n, l->buf + l->pos, l->len - l->pos);
    memcpy(l->buf + l->pos, s, n);
    l->len += n;
    l->pos += n;
    l->buf[l->len] = '\0';
}

/* Delete bytes [from, to); the cursor goes to from. */
static void erase(Line *l, size_t from, size_t to) {
    memmove(l->buf + from, l->buf + to, l->len - to);
    l->len -= to - from;
    l->pos = from;
    l->buf[l->len] = '\0';
}

/* The text becomes s (a line of the history, or the draft), the cursor at its end. */
static void replace(Line *l, const char *s) {
    size_t n = strlen(s);
    if (n > l->max_bytes) n = l->max_bytes;
    reserve(l, n);
    memcpy(l->buf, s, n);
    l->buf[n] = '\0';
    l->len = l->pos = n;
}

/* Up (step -1) or Down (+1) through the history; the line being typed is kept
 * as the draft while an older one is shown. */
static void browse(Line *l, const LineEditor *ed, int step) {
    int to = l->shown + step;
    if (to < 0 || to > ed->n) return;
    if (l->shown == ed->n) {
        free(l->draft);
        l->draft = strdup(l->buf);
        if (!l->draft) die(EXIT_BAD_INPUT, "stdin: out of memory");
    }
    l->shown = to;
    replace(l, to == ed->n ? l->draft : ed->lines[to]);
}

/* Columns a text takes: one per character. */
static size_t columns(const char *s, size_t n) {
    size_t cols = 0;
    for (size_t i = 0; i < n; i++) cols += !is_continuation(s[i]);
    return cols;
}

static size_t terminal_width(int fd) {
#ifdef TIOCGWINSZ
    struct winsize ws;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
#endif
    return 80;
}

/* Redraw the line: the prompt and the part of the text around the cursor that
 * fits the terminal (the text scrolls sideways), the rest of the row cleared;
 * then the cursor is placed by writing the prompt and the text up to it again. */
static void refresh(const Line *l) {
    size_t width = terminal_width(l->fd), prompt_cols = columns(l->prompt, strlen(l->prompt));
    size_t room = width > prompt_cols + 1 ? width - prompt_cols - 1 : 1; // the last column holds the cursor
    size_t from = 0, cols = columns(l->buf, l->pos); // cols: columns of buf[from..pos)
    while (cols > room) {
        from = next_char(l, from);
        cols--;
    }
    size_t to = l->pos;
    while (to < l->len && cols < room) {
        to = next_char(l, to);
        cols++;
    }
    write_str(l->fd, "\r");
    write_str(l->fd, l->prompt);
    write_all(l->fd, l->buf + from, to - from);
    write_str(l->fd, "\x1b[K\r");
    write_str(l->fd, l->prompt);
    write_all(l->fd, l->buf + from, l->pos - from);
}

/* Ctrl-Z: the terminal as it was, stop as a shell job; on `fg`, raw mode again. */
static void suspend(void) {
    leave_raw_mode();
    raise(SIGTSTP);
    enter_raw_mode();
}

/* Apply one editing key to the line. */
static void edit(Line *l, const LineEditor *ed, const Key *k) {
    switch (k->code) {
    case KEY_TEXT: insert(l, k->text, (size_t)k->len); break;
    case KEY_LEFT: case CONTROL('B'): if (l->pos > 0) l->pos = prev_char(l, l->pos); break;
    case KEY_RIGHT: case CONTROL('F'): if (l->pos < l->len) l->pos = next_char(l, l->pos); break;
    case KEY_HOME: case CONTROL('A'): l->pos = 0; break;
    case KEY_END: case CONTROL('E'): l->pos = l->len; break;
    case 127: case CONTROL('H'): if (l->pos > 0) erase(l, prev_char(l, l->pos), l->pos); break;
    case KEY_DELETE: case CONTROL('D'): if (l->pos < l->len) erase(l, l->pos, next_char(l, l->pos)); break;
    case CONTROL('U'): erase(l, 0, l->pos); break;
    case CONTROL('K'): erase(l, l->pos, l->len); break;
    case KEY_UP: case CONTROL('P'): browse(l, ed, -1); break;
    case KEY_DOWN: case CONTROL('N'): browse(l, ed, +1); break;
    case CONTROL('Z'): suspend(); break;
    default: break; // other control keys, unknown escapes
    }
}

/* Keep a line for Up/Down: not an empty one, nor the same as the last. */
static void remember(LineEditor *ed, const char *text) {
    if (!text[0] || (ed->n > 0 && !strcmp(ed->lines[ed->n - 1], text))) return;
    if (ed->n == ed->cap) {
        ed->cap = ed->cap ? 2 * ed->cap : 16;
        ed->lines = realloc(ed->lines, (size_t)ed->cap * sizeof *ed->lines);
        if (!ed->lines) die(EXIT_BAD_INPUT, "stdin: out of memory");
    }
    if (!(ed->lines[ed->n++] = strdup(text))) die(EXIT_BAD_INPUT, "stdin: out of memory");
}

LineResult lineedit_read(LineEditor *ed, const char *prompt, size_t max_bytes, char **line, size_t *len) {
    Line l = {.max_bytes = max_bytes, .prompt = prompt, .fd = ed->fd, .shown = ed->n};
    reserve(&l, 64);
    l.buf[0] = '\0';
    fflush(stdout);
    enter_raw_mode();
    refresh(&l);
    LineResult result;
    for (;;) {
        Key k = read_key();
        if (k.code == KEY_GONE || (k.code == CONTROL('D') && l.len == 0)) {
            result = LINE_END;
            write_str(l.fd, "\n");
            break;
        }
        if (k.code == '\r' || k.code == '\n' || k.code == CONTROL('C')) {
            l.pos = l.len; // the whole line (its end) stays on the screen
            refresh(&l);
            write_str(l.fd, k.code == CONTROL('C') ? "^C\n" : "\n");
            result = k.code == CONTROL('C') ? LINE_CANCELLED : LINE_ENTERED;
            break;
        }
        edit(&l, ed, &k);
        if (!byte_waiting(0)) refresh(&l); // a paste redraws once, at its end
    }
    leave_raw_mode();
    free(l.draft);
    *len = l.len;
    *line = NULL;
    if (result == LINE_ENTERED) {
        remember(ed, l.buf);
        *line = l.buf;
    } else {
        free(l.buf);
    }
    return result;
}

void lineedit_free(LineEditor *ed) {
    for (int i = 0; i < ed->n; i++) free(ed->lines[i]);
    free(ed->lines);
    ed->lines = NULL;
    ed->n = ed->cap = 0;
}
