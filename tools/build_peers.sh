#!/usr/bin/env bash
# tools/build_peers.sh: build the two programs `make bench` measures run
# against, llama.cpp and llama2.c, from their public git sources, in a folder
# outside this repository. Nothing of theirs is copied into the repository.
#
#   tools/build_peers.sh LLAMA_CPP_GIT LLAMA2C_GIT [DEST]
#
# LLAMA_CPP_GIT, LLAMA2C_GIT: git repositories (a clone or a bare mirror) of
#   ggerganov/llama.cpp and karpathy/llama2.c; their HEAD commit is built.
# DEST: where the builds go (default $TMPDIR/peers, /tmp/peers without
#   TMPDIR); must not be inside this repository.
# Prints DEST on stdout when both are built (progress goes to stderr), so that
#   make bench PEERS="$(tools/build_peers.sh ../llama.cpp ../llama2.c)"
# works. A peer already built in DEST is left as it is (delete its folder to
# rebuild). Needs git, a C compiler, and for llama.cpp cmake and a C++
# compiler (apt-get install cmake g++); llama.cpp takes minutes, llama2.c
# seconds. Exit status: 0 built, 1 a build failed (the message names the log
# or the source), 2 bad arguments.
#
# What it makes (and DEST/llama.cpp/COMMIT, DEST/llama2c/COMMIT: the commits built):
#   DEST/llama.cpp/build/bin/llama-bench       prompt and generation rates
#   DEST/llama.cpp/build/bin/llama-perplexity  long-window perplexity
#   DEST/llama.cpp/build/bin/llama-quantize    GGUF -> f32 / q8_0 GGUF
#   DEST/llama.cpp/build/bin/llama-convert-llama2c-to-ggml   llama2.c checkpoint -> GGUF
#     (CMake Release, GGML_NATIVE: the instruction sets of this CPU, OpenMP)
#   DEST/llama2c/run, DEST/llama2c/runq
#     (its `make runomp` flags: -Ofast -march=native -fopenmp), changed in one
#     place: generation no longer stops when the model samples BOS, so that
#     random-weight checkpoints generate the whole -n (run's --ignore-eos).
set -euo pipefail

# usage: the comment above, on stderr; exit 2.
usage() {
    sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

say() { echo "build_peers: $*" >&2; }
die() { say "$*"; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || usage
lcpp_src=$1
l2c_src=$2
dest=${3:-${TMPDIR:-/tmp}/peers}
repo=$(cd "$(dirname "$0")/.." && pwd -P)

for src in "$lcpp_src" "$l2c_src"; do
    git -C "$src" rev-parse --verify -q 'HEAD^{commit}' >/dev/null 2>&1 ||
        { say "$src: expected a git repository with a HEAD commit, found none"; exit 2; }
done
dest=$(realpath -m "$dest")
case "$dest/" in
"$repo"/*) say "DEST $dest: expected a folder outside the repository $repo"; exit 2 ;;
esac
mkdir -p "$dest" || { say "DEST $dest: cannot create it"; exit 2; }

# export_head SRC DIR: the files of SRC's HEAD commit into DIR (no .git).
# Blobs the repository does not hold (a partial mirror may lack large binary
# files, such as llama.cpp's test vocabularies under models/) are left out and
# named; submodules are not exported.
export_head() {
    local src=$1 dir=$2 entry status i paths=() shas=() present=() missing=()
    while IFS= read -r -d '' entry; do  # "<mode> <type> <sha>\t<path>"
        case "$entry" in *" blob "*) ;; *) continue ;; esac
        paths+=("${entry#*$'\t'}")
        entry=${entry#* blob }
        shas+=("${entry%%$'\t'*}")
    done < <(git -C "$src" ls-tree -r -z HEAD)
    # one line per object: its name when the repository has it, "<sha> missing" when not
    mapfile -t status < <(printf '%s\n' "${shas[@]}" | git -C "$src" cat-file --batch-check='%(objectname)')
    for i in "${!paths[@]}"; do
        if [ "${status[i]}" = "${shas[i]}" ]; then present+=("${paths[i]}"); else missing+=("${paths[i]}"); fi
    done
    [ ${#missing[@]} -eq 0 ] || say "$src: left out ${#missing[@]} file(s) the repository lacks: ${missing[*]}"
    mkdir -p "$dir"
    # git archive still looks at the absent blobs beside the paths it is given
    # and says "invalid object" for each (then exits 0): those are the files
    # named above, so their lines are dropped
    git -C "$src" archive --format=tar HEAD -- "${present[@]}" 2> >(grep -v '^error: invalid object' >&2) |
        tar -x -C "$dir"
}

# llama.cpp: the four tools above, static, Release, tuned for this CPU.
build_llama_cpp() {
    local dir=$dest/llama.cpp bin=$dest/llama.cpp/build/bin log=$dest/llama.cpp-build.log
    local tools=(llama-bench llama-perplexity llama-quantize llama-convert-llama2c-to-ggml) t done=1
    for t in "${tools[@]}"; do [ -x "$bin/$t" ] || done=0; done
    if [ $done = 1 ]; then say "llama.cpp: already built in $dir"; return; fi
    if [ ! -f "$dir/CMakeLists.txt" ]; then
        say "llama.cpp: exporting $(git -C "$lcpp_src" rev-parse --short HEAD) from $lcpp_src"
        export_head "$lcpp_src" "$dir"
        git -C "$lcpp_src" rev-parse HEAD >"$dir/COMMIT"
    fi
    command -v cmake >/dev/null && command -v "${CXX:-c++}" >/dev/null ||
        die "llama.cpp: expected cmake and ${CXX:-c++} on PATH, found $(command -v cmake "${CXX:-c++}" | tr '\n' ' ')(apt-get install cmake g++)"
    say "llama.cpp: building ${tools[*]} (minutes; log in $log)"
    {
        cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF &&
            cmake --build "$dir/build" -j "$(nproc)" --target "${tools[@]}"
    } >"$log" 2>&1 || die "llama.cpp: the build failed; see $log"
}

# llama2.c: run.c and runq.c, each one file, with the BOS stop removed.
build_llama2c() {
    local dir=$dest/llama2c name
    if [ -x "$dir/run" ] && [ -x "$dir/runq" ]; then say "llama2.c: already built in $dir"; return; fi
    say "llama2.c: building run and runq from $(git -C "$l2c_src" rev-parse --short HEAD) of $l2c_src"
    mkdir -p "$dir"
    git -C "$l2c_src" rev-parse HEAD >"$dir/COMMIT"
    for name in run runq; do
        git -C "$l2c_src" show "HEAD:$name.c" >"$dir/$name.c.orig" ||
            die "$l2c_src: expected $name.c in its HEAD commit"
        # the line that ends generation at a sampled BOS (token 1), alone on
        # its line; refuse a source where it is not there exactly once
        local stop='^[[:space:]]*if \(next == 1\) \{ break; \}[[:space:]]*$' n
        n=$(grep -cE "$stop" "$dir/$name.c.orig" || true)
        [ "$n" = 1 ] || die "$l2c_src: $name.c: expected the line 'if (next == 1) { break; }' once, found it $n times"
        grep -vE "$stop" "$dir/$name.c.orig" >"$dir/$name.c"
        "${CC:-cc}" -Ofast -march=native -fopenmp -o "$dir/$name" "$dir/$name.c" -lm 2>"$dir/$name.log" ||
            die "llama2.c: $name.c did not compile; see $dir/$name.log"
    done
}

build_llama2c
build_llama_cpp
echo "$dest"
