#!/usr/bin/env python3
"""The repository's own rules, checked on every `make test` (`make lint`).

Each rule keeps the project readable by someone who has only a clone of it:

  run-c-lines      run.c holds at most 1,700 lines: the model and main stay a
                   file one can read in a sitting; a mode or a kernel that
                   grows goes to a file of its own.
  function-length  a C or Python function holds at most 100 lines, outside
                   tests/ and outside data tables (a generated file that says
                   "generated ... do not edit" in its first lines).
  outside-doc      documentation and comments cite no document a clone lacks.
                   A path that leaves the repository is a breach: one that
                   begins with ../ (unless, read from the file's folder, it
                   is a file of the repository) or with shared/ (the shared
                   folder beside the repository, named as from its parent),
                   but for the shared inputs (see OUTSIDE_OK). A relative path of a document (*.md,
                   *.rst, *.pdf) with a slash in it must be a file of the
                   repository, read from the root or from the file's folder;
                   a folder written in capitals (DIR, OUT) is a placeholder.
                   A document named alone (no slash) must be the name of a
                   file of the repository: the team's notes kept beside the
                   repository are not. Other files (*.txt, *.json, *.bin) may
                   be named by a path the repository lacks: commands make
                   them (texts/, models/smollm2/, results). A public URL is
                   not a breach: every reader can follow it, as they can the
                   papers the docs cite by author and year.
  machine-path     documentation and comments hold no absolute path of one
                   machine: a folder under home, Users, root, work, mnt,
                   media, scratch, data, opt, srv, nfs, gpfs or lustre at the
                   top of the file system, or under var/folders (macOS's
                   temporary folders); a path in the home folder, written
                   with a tilde or with the HOME variable (but .cache,
                   .config and .local in it, the per-user folders every
                   system names alike); a Windows drive path; a file: or
                   localhost URL; or a temporary folder that pytest or
                   Python's tempfile made under tmp. Any other path under
                   tmp is the same scratch folder on every machine, and dev,
                   proc, usr are the system's: these are not flagged.
  link             a relative link of a markdown file (inline, image,
                   reference-style, <a href> or <img src>; outside code)
                   leads to a file of the repository and, with #anchor on a
                   .md file, to a heading of it (GitHub's slug) or an
                   <a name|id=...> in it.
  help-lines       `./run --help` fits one screen: at most 25 lines.

Where each rule looks:
  documentation  every .md file, and every text file under docs/ (the study's
                 tables and cells included); .md files are also link-checked.
  comments       the comments of the source, tests/ included (there, ../shared
                 and its models and data are the inputs the tests read on
                 purpose): C and headers (/* */, //), Python (# and
                 docstrings), shell scripts and the Makefile (lines that
                 begin with #).

The files are those git knows: tracked, plus untracked ones that .gitignore
does not exclude, so build outputs, virtual environments and downloaded
models are never read.

A breach that is right for a reason gets one line in the allow-list
(tools/lint-allow.txt):

    CHECK  PLACE  REASON...

PLACE is what the breach line names after "at": run.c for run-c-lines,
FILE:FUNCTION for function-length (Python: the dotted path, Class.method or
outer.inner), FILE:FOUND for outside-doc and machine-path, FILE:TARGET for
link, --help for help-lines. REASON is required. An entry that matches no
breach is itself a breach, so the list cannot outlive what it excuses.

Output: one line per breach, `path:line: CHECK at PLACE: expected ...,
found ...` (CHECK allow-list for an entry that is stale or not an entry),
then one closing line; exit status 1 when there is a breach, 0 when there is
none, 2 when the lint itself cannot run (not a git checkout).

Usage: python3 tools/lint.py [--root DIR] [--run PATH] [--allow FILE]
Standard library only, so that any Python 3.8 or newer runs it.
"""

import argparse
import ast
import io
import os
import pathlib
import posixpath
import re
import subprocess
import sys
import tokenize
import urllib.parse
from collections import namedtuple

RUN_C_MAX_LINES = 1700
FUNCTION_MAX_LINES = 100
HELP_MAX_LINES = 25

# Paths out of the repository that documentation may name: the shared folder
# beside it and its models and data, the inputs the tests and the study read
# (tests/README.md says what skips without them). Anything else out there,
# its docs/ among it, is a document a clone does not have.
OUTSIDE_OK = ("shared", "shared/models", "shared/data")

CHECKS = ("run-c-lines", "function-length", "outside-doc", "machine-path", "link", "help-lines")

Breach = namedtuple("Breach", "path line check place expected found")


def breach_text(b):
    """The line a breach prints: path:line: check at place: expected ..., found ..."""
    return f"{b.path}:{b.line}: {b.check} at {b.place}: expected {b.expected}, found {b.found}"


# ---------------------------------------------------------------------------
# The files


def repo_files(root):
    """Paths (relative, '/'-separated) of the files git tracks or would track:
    `git ls-files` plus the untracked files .gitignore does not exclude.
    Files deleted from the working tree are left out."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True).stdout
    names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
    return [n for n in names if (root / n).is_file()]


def read_text(path):
    """A file's text, or None for a binary file (a NUL byte, or not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def in_tests(name):
    """tests/ is outside the function-length rule (its comments are read)."""
    return name.startswith("tests/")


def is_data_table(text):
    """A generated file (a data table) says so in its first lines: "generated"
    and "do not edit" (unicode_tables.h, from tools/gen_unicode.py)."""
    head = "\n".join(text.splitlines()[:5]).lower()
    return "generated" in head and "do not edit" in head


def is_shell(name, text):
    """A shell script: *.sh, or a #! line that names sh, bash, dash or zsh."""
    first = text.split("\n", 1)[0]
    return name.endswith(".sh") or (first.startswith("#!") and re.search(r"\b(ba|da|z)?sh\b", first))


# ---------------------------------------------------------------------------
# C: comments and file-scope functions


def split_c(text):
    """C text -> (code, comments). code is the text with every comment,
    string and character literal and preprocessor line blanked (spaces, the
    newlines kept, so offsets and line numbers still hold); comments is a
    list of (line, text)."""
    out, comments = list(text), []
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        two = text[i:i + 2]
        if at_line_start and c == "#":  # a directive, with its \ continuations
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 1
                j += 1
            comment_at = text.find("/*", i, j)  # a comment after a directive still counts
            if comment_at < 0:
                comment_at = text.find("//", i, j)
            if comment_at >= 0:
                j = comment_at
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            line += text.count("\n", i, j)
            i = j
            at_line_start = False
            continue
        if two in ("/*", "//"):
            close = "*/" if two == "/*" else "\n"
            end = text.find(close, i + 2)
            end = n if end < 0 else end + (2 if two == "/*" else 0)
            comments.append((line, text[i:end]))
        elif c in "\"'":
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            if c == "\n":
                line += 1
                at_line_start = True
            elif not c.isspace():
                at_line_start = False
            i += 1
            continue
        for k in range(i, end):
            if out[k] != "\n":
                out[k] = " "
        line += text.count("\n", i, end)
        i = end
    return "".join(out), comments


def c_functions(text):
    """The functions defined at file scope: (name, first line, last line).
    A function's first line is its head's (the return type's); its last is
    the line of the brace that closes its body. A brace at file scope opens
    a function body when what stands before it, since the last ; or } or
    directive, ends with ) and holds no = (an initializer) outside parentheses."""
    code, _ = split_c(text)
    found = []
    depth, start, body_start = 0, 0, None
    name, first = None, 0
    for i, c in enumerate(code):
        if c == "{":
            if depth == 0:
                head = code[start:i]
                if is_function_head(head):
                    name = function_name(head)
                    lead = len(head) - len(head.lstrip())
                    first = code.count("\n", 0, start + lead) + 1
                    body_start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if body_start is not None:
                    found.append((name, first, code.count("\n", 0, i) + 1))
                body_start = None
                start = i + 1
        elif c == ";" and depth == 0:
            start = i + 1
    return found


def is_function_head(head):
    """Whether the code before a file-scope { is a function's head."""
    flat = head.strip()
    if not flat.endswith(")"):
        return False
    depth = 0
    for c in flat:
        depth += (c == "(") - (c == ")")
        if c == "=" and depth == 0:
            return False
    return True


def function_name(head):
    """The name before the parameter list (attributes skipped)."""
    for m in re.finditer(r"(\w+)\s*\(", head):
        if m.group(1) not in ("__attribute__", "__declspec", "_Alignas", "alignas"):
            return m.group(1)
    return "?"


# ---------------------------------------------------------------------------
# Python: comments, docstrings and functions


def python_functions(tree):
    """Every def, nested ones too: (dotted name, first line, last line); the
    first line is the def's (decorators are not counted)."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child.lineno, child.end_lineno))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def python_comments(text, tree):
    """(line, text) of each # comment and each docstring (module, class,
    function), as written in the source."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add((body[0].lineno, body[0].col_offset))
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start in docstrings):
                if not (tok.start[0] == 1 and tok.string.startswith("#!")):
                    found.append((tok.start[0], tok.string))
    except (tokenize.TokenError, SyntaxError):  # ast parsed it, so this is rare: keep what was read
        pass
    return found


def hash_comments(text):
    """(line, text) of the lines that begin with # (shell scripts, the
    Makefile); a #! first line is not a comment."""
    return [(k, line) for k, line in enumerate(text.splitlines(), 1)
            if line.lstrip().startswith("#") and not (k == 1 and line.startswith("#!"))]


# ---------------------------------------------------------------------------
# Citations and machine paths

STOP = r"""\s`'"()<>\[\]{},;|*"""
# ../ at the start of a path, not inside one (a/../b) nor after $VAR
RELATIVE_OUT = re.compile(rf"(?<![\w.~/$-])(?:\.\./)+[^{STOP}]*")
# shared/... at the start of a path: the shared folder beside the repository,
# named as from its parent (the repository has no shared/ of its own)
SHARED_PATH = re.compile(rf"(?<![\w.~/$-])shared/[^{STOP}]*")
# a document by its name alone (README.md), and by a relative path
# (docs/rope.md, ./README.md); neither after / (the rest of a longer path),
# $ (a variable) or ~
DOC_NAME = re.compile(r"(?<![\w./$-])[\w-][\w.-]*\.(?:md|rst|pdf)\b(?![\w/-])")
DOC_PATH = re.compile(r"(?<![\w./$~:-])(?:[\w.-]+/)+[\w.-]*\.(?:md|rst|pdf)\b(?![\w/-])")
# a folder written in capitals (DIR/, OUT/) is a placeholder the reader fills in
PLACEHOLDER = re.compile(r"(?:^|/)[A-Z][A-Z0-9_]*/")
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s<>\"'`)\]]*")
MACHINE_PATH = re.compile(
    rf"(?<![\w.~/:$-])/(?:home|root|Users|work|mnt|media|scratch|data|opt|srv|nfs|gpfs|lustre|var/folders)"
    rf"(?=/|[^\w.-]|$)[^{STOP}]*"
    rf"|(?<![\w.~/:$-])/tmp/(?:pytest-of-|tmp[a-z0-9_]{{8}}\b)[^{STOP}]*"
    rf"|(?<![\w.~/:$-])(?:~|\$HOME|\$\{{HOME\}})/(?!\.(?:cache|config|local)(?:/|[^\w.-]|$))[^{STOP}]*"
    rf"|\bfile://[^{STOP}]*"
    rf"|\bhttps?://(?:localhost|127\.0\.0\.1)\b[^{STOP}]*"
    rf"|(?<![\w])[A-Z]:\\{{1,2}}[\w][^{STOP}]*")

Repo = namedtuple("Repo", "files dirs doc_names")


def clean(found):
    """A path found in prose, without the sentence's full stop or colon."""
    return found.rstrip(".:")


def outside_path(found):
    """Whether a ../ path (read from the repository root, as the commands in
    the docs are) leaves the repository for anything but OUTSIDE_OK."""
    norm = posixpath.normpath(found.rstrip("/"))
    if not norm.startswith("../"):
        return False
    rest = norm[3:]
    if rest.startswith("../"):
        return True
    return not any(rest == ok or (ok != "shared" and rest.startswith(ok + "/")) for ok in OUTSIDE_OK)


def in_repo(name, path, repo):
    """Whether a relative path, read from the repository root or from the
    folder of file name, is a file or folder of the repository."""
    for base in ("", posixpath.dirname(name)):
        norm = posixpath.normpath(posixpath.join(base, path.rstrip("/")))
        if norm in repo.files or norm in repo.dirs or (norm == "." and path):
            return True
    return False


def cited_path_breach(name, path, repo):
    """What is wrong with a relative path cited at file name: "outside" (it
    leaves the repository, but for OUTSIDE_OK), "missing" (a document the
    repository lacks) or None. path is a ../ or shared/ path (any file) or a
    path of a document (*.md, *.rst, *.pdf)."""
    if in_repo(name, path.split("#")[0], repo) or PLACEHOLDER.search(path):
        return None
    norm = posixpath.normpath(path)
    if norm.startswith("../") or norm == "..":
        return "outside" if outside_path(norm) else None
    if (norm + "/").startswith("shared/"):
        return "outside" if outside_path("../" + norm) else None
    return "missing" if re.search(r"\.(?:md|rst|pdf)$", norm) else None


def cited_paths(line):
    """The relative paths a line cites: ../ paths and shared/ paths (of any
    file), then paths of documents that are not part of one of those."""
    found, taken = [], []
    for pattern in (RELATIVE_OUT, SHARED_PATH, DOC_PATH):
        for m in pattern.finditer(line):
            if not any(start <= m.start() < end for start, end in taken):
                taken.append(m.span())
                found.append(clean(m.group(0)))
    return found


def scan_citations(name, text, first_line, repo):
    """Breaches of outside-doc and machine-path in one piece of text (a
    comment, or a whole document) starting at first_line of file name."""
    found = []
    for k, line in enumerate(text.split("\n")):
        at = first_line + k
        for m in MACHINE_PATH.finditer(line):
            path = clean(m.group(0))
            found.append(Breach(name, at, "machine-path", f"{name}:{path}", "a path every clone has", path))
        line = URL.sub(lambda u: " " * len(u.group(0)), line)  # a URL's path is the site's
        for path in cited_paths(line):
            why = cited_path_breach(name, path, repo)
            if why == "outside":
                found.append(Breach(name, at, "outside-doc", f"{name}:{path}",
                                    "a path inside the repository or under ../shared/models or ../shared/data", path))
            elif why == "missing":
                found.append(Breach(name, at, "outside-doc", f"{name}:{path}", "a document of the repository", path))
        for m in DOC_NAME.finditer(line):
            if m.group(0) not in repo.doc_names:
                found.append(Breach(name, at, "outside-doc", f"{name}:{m.group(0)}",
                                    "a document of the repository", m.group(0)))
    return found


# ---------------------------------------------------------------------------
# Markdown: links and headings

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def markdown_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for k, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip().lstrip(fence[0]):
            fence = None
        elif fence is None:
            yield k, line


def markdown_paragraphs(text):
    """(first line, text) of each run of non-blank lines outside fenced code
    blocks: a link's text may wrap onto the next line."""
    first, lines = None, []
    for k, line in markdown_lines(text):
        if line.strip() and first is not None and k == first + len(lines):
            lines.append(line)
            continue
        if lines:
            yield first, "\n".join(lines)
        first, lines = (k, [line]) if line.strip() else (None, [])
    if lines:
        yield first, "\n".join(lines)


def markdown_links(text):
    """(line, target) of each inline, image and reference-style link, and
    each <a href> and <img src>, outside code (fenced blocks and `code
    spans`); line: where its target is."""
    for first, para in markdown_paragraphs(text):
        para = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), para)
        for m in [m for r in (INLINE_LINK, REFERENCE_DEF, HTML_LINK) for m in r.finditer(para)]:
            yield first + para.count("\n", 0, m.start(1)), m.group(1).strip("<>")


def slug(heading):
    """GitHub's anchor for a heading: its text as rendered (code spans keep
    their text; links their text; images and HTML tags drop), lower case,
    every character but letters, digits, _, - and space dropped, each space
    a hyphen."""
    parts = []
    for k, piece in enumerate(CODE_SPAN.split(heading)):
        if k % 3 == 2:  # a code span's text, as written
            parts.append(piece)
        elif k % 3 == 0:
            piece = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", piece)
            piece = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", piece)
            piece = re.sub(r"<[^>]+>", "", piece)
            piece = re.sub(r"(?<!\w)_+(\S(?:.*?\S)?)_+(?!\w)", r"\1", piece)
            parts.append(piece)
    text = "".join(parts).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def markdown_anchors(text):
    """The anchors a markdown file defines: its headings' slugs (a repeated
    slug gets -1, -2, ...) and the names of its <a name=...> / <a id=...>."""
    anchors, seen, prev = set(), {}, ""
    for _, line in markdown_lines(text):
        title = None
        m = re.match(r"^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$", line)
        if m:
            title = m.group(1) or ""
        elif re.match(r"^ {0,3}(=+|-+)\s*$", line) and prev.strip() \
                and not re.match(r"^\s*([-*+>|#]|\d+[.)])", prev):
            title = prev.strip()
        if title is not None:
            base = slug(title)
            s = base
            while s in seen:
                seen[base] += 1
                s = f"{base}-{seen[base]}"
            seen[s] = 0
            anchors.add(s)
        anchors.update(HTML_ANCHOR.findall(line))
        prev = "" if title is not None else line
    return anchors


def blank_link_targets(name, text):
    """A markdown file's text with its link targets blanked, for the scan of
    citations: a link is resolved from its file by check_links instead."""
    if not name.endswith(".md"):
        return text

    def blank(m):
        start, end = m.start(1) - m.start(0), m.end(1) - m.start(0)
        return m.group(0)[:start] + " " * (end - start) + m.group(0)[end:]

    for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_LINK):
        text = pattern.sub(blank, text)
    return text


def check_links(name, text, repo, read):
    """Breaches of link (and of outside-doc, for a link out of the
    repository) in the markdown file name."""
    found = []
    for line, target in markdown_links(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        path = urllib.parse.unquote(path)
        if path.startswith("/"):
            resolved = posixpath.normpath(path.lstrip("/"))
        elif path:
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), path))
        else:
            resolved = name
        place = f"{name}:{target}"
        if resolved == ".." or resolved.startswith("../"):
            found.append(Breach(name, line, "outside-doc", place, "a file of the repository", target))
            continue
        resolved = "" if resolved == "." else resolved
        if resolved not in repo.files and resolved not in repo.dirs:
            found.append(Breach(name, line, "link", place, "a file of the repository",
                                f"no {resolved or '.'}"))
            continue
        if anchor and resolved.endswith(".md") and resolved in repo.files:
            anchor = urllib.parse.unquote(anchor)
            if anchor not in markdown_anchors(read(resolved) or ""):
                found.append(Breach(name, line, "link", place,
                                    f'a heading or anchor "{anchor}" in {resolved}', "none"))
    return found


# ---------------------------------------------------------------------------
# The checks over the tree


def parent_dirs(name):
    """'a/b/c' -> ['a', 'a/b']: the folders a link may name."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]


def check_tree(root, files):
    """Every breach of the file rules (all but help-lines)."""
    cache = {}

    def read(name):
        if name not in cache:
            cache[name] = read_text(root / name)
        return cache[name]

    repo = Repo(files=set(files), dirs={""} | {d for n in files for d in parent_dirs(n)},
                doc_names={posixpath.basename(n) for n in files})
    found = []
    for name in files:
        text = read(name)
        if text is None:
            continue
        lines = text.count("\n") + (not text.endswith("\n") and text != "")
        if name == "run.c" and lines > RUN_C_MAX_LINES:
            found.append(Breach(name, RUN_C_MAX_LINES + 1, "run-c-lines", name,
                                f"at most {RUN_C_MAX_LINES} lines", f"{lines}"))
        is_doc = name.endswith(".md") or name.startswith("docs/")
        if is_doc:
            found += scan_citations(name, blank_link_targets(name, text), 1, repo)
        if name.endswith(".md"):
            found += check_links(name, text, repo, read)
        if is_doc:
            continue
        comments, functions = [], []
        if name.endswith((".c", ".h")):
            comments = split_c(text)[1]
            if not is_data_table(text) and not in_tests(name):
                functions = c_functions(text)
        elif name.endswith(".py"):
            try:
                tree = ast.parse(text, filename=name)
            except SyntaxError as e:
                found.append(Breach(name, e.lineno or 1, "function-length", f"{name}:?",
                                    "Python that parses", f"a syntax error ({e.msg})"))
                continue
            comments = python_comments(text, tree)
            if not is_data_table(text) and not in_tests(name):
                functions = python_functions(tree)
        elif posixpath.basename(name) == "Makefile" or is_shell(name, text):
            comments = hash_comments(text)
        for line, comment in comments:
            found += scan_citations(name, comment, line, repo)
        for fname, first, last in functions:
            if last - first + 1 > FUNCTION_MAX_LINES:
                found.append(Breach(name, first, "function-length", f"{name}:{fname}",
                                    f"at most {FUNCTION_MAX_LINES} lines", f"{last - first + 1}"))
    return found


def check_help(run):
    """help-lines: `run --help` (stdout and stderr, what the screen shows)."""
    try:
        p = subprocess.run([str(run), "--help"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [Breach("./run --help", 0, "help-lines", "--help", "a program that prints its help",
                       f"{type(e).__name__}: {e}")]
    lines = (p.stdout + p.stderr).decode("utf-8", "replace").splitlines()
    if p.returncode != 0:
        return [Breach("./run --help", 0, "help-lines", "--help", "exit status 0", f"{p.returncode}")]
    if len(lines) > HELP_MAX_LINES:
        return [Breach("./run --help", HELP_MAX_LINES + 1, "help-lines", "--help",
                       f"at most {HELP_MAX_LINES} lines", f"{len(lines)}")]
    return []


# ---------------------------------------------------------------------------
# The allow-list

Entry = namedtuple("Entry", "line check place reason")


def read_allow(path, shown):
    """The entries of the allow-list at path (none when it is absent), and
    a breach for each line that is not a valid entry. shown: the path as
    breach lines name it."""
    entries, errors = [], []
    if not path.is_file():
        return entries, errors
    for k, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(None, 2)
        if len(fields) < 3 or fields[0] not in CHECKS:
            errors.append(Breach(shown, k, "allow-list", "entry",
                                 f'"CHECK PLACE REASON" with CHECK one of {", ".join(CHECKS)}',
                                 f'"{line}"'))
            continue
        entries.append(Entry(k, *fields))
    return entries, errors


def apply_allow(breaches, entries, shown):
    """(breaches no entry allows, the number allowed, a breach per entry that
    allows nothing)."""
    keys = {(e.check, e.place) for e in entries}
    left = [b for b in breaches if (b.check, b.place) not in keys]
    used = {(b.check, b.place) for b in breaches}
    stale = [Breach(shown, e.line, "allow-list", f"{e.check} {e.place}",
                    "a breach this entry allows", "none (remove the entry)")
             for e in entries if (e.check, e.place) not in used]
    return left, len(breaches) - len(left), stale


def main(argv=None):
    here = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=pathlib.Path, default=here, help="the repository (default: this one)")
    ap.add_argument("--run", type=pathlib.Path, help="the ./run to ask for --help (default: ROOT/run)")
    ap.add_argument("--allow", type=pathlib.Path, help="the allow-list (default: ROOT/tools/lint-allow.txt)")
    a = ap.parse_args(argv)
    root = a.root.resolve()
    allow = a.allow or root / "tools" / "lint-allow.txt"
    try:
        shown = os.path.relpath(allow.resolve(), root)
        files = repo_files(root)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        print(f"lint: cannot list the files of {root} with git: {e}", file=sys.stderr)
        return 2
    breaches = check_tree(root, files) + check_help((a.run or root / "run").resolve())
    entries, errors = read_allow(allow, shown)
    left, allowed, stale = apply_allow(breaches, entries, shown)
    report = sorted(left + errors + stale, key=lambda b: (b.path, b.line, b.check, b.place))
    for b in report:
        print(breach_text(b))
    note = f" ({allowed} allowed by {shown})" if allowed else ""
    if report:
        print(f"lint: {len(report)} breach{'es' if len(report) != 1 else ''} of the rules in tools/lint.py{note}")
        return 1
    print(f"lint: clean, {len(files)} files read{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
