"""The bash the grader runs in the sandbox (always in clean one-off shells, in the repository).

Every script reads its inputs from variables set on its first line by
:func:`with_vars` and prints what it found on its standard output, the exec
channel (``key=value`` lines, and bulk data as one ``blob:NAME=<base64>`` line):
the grader reads no file of the sandbox back. File lists are NUL-separated.
Bytes travel as base64 (runtimes carry text).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping

from uniagent.grading.sandbox import GIT_FUNCTION
from uniagent.protect.rules import CODE_PATTERNS


def with_vars(script: str, variables: Mapping[str, str]) -> str:
    """``script`` preceded by shell assignments of ``variables`` (quoted).

    With ``REPO`` among them, git (``gitc``) never looks for a repository above it: a work
    dir that is no repository of its own but lies inside another one (a host sandbox under
    a checkout's temporary directory) is graded as no repository, never as the enclosing
    one (whose history the scrub would rewrite).
    """
    values = dict(variables)
    repo = values.get("REPO")
    if repo and posixpath.isabs(repo):
        values.setdefault("GIT_CEILING", posixpath.dirname(posixpath.normpath(repo)))
    head = " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items())
    return f"{head}\n{GIT_FUNCTION}\n{script}"


def _find_names(patterns: tuple[str, ...]) -> str:
    tests = [
        f"-path '*/{p.rstrip('/')}/*'" if p.endswith("/") else f"-name '{p}'" for p in patterns
    ]
    return r"\( " + " -o ".join(tests) + r" \)"


#: ``blob:list=``: every entry of the tree as ``TYPE PATH\0`` (f file, l symlink, d dir),
#: .git's bulk skipped but for what in it is not git's: importable files anywhere in it,
#: and files of objects/ and lfs/ that are not git's shape. With $SINCE (the baseline's
#: clock, at grading) the same walk also notes the symlinks made or changed since then:
#: ``links=N`` and ``blob:links=`` (empty where N is 0; else the repository's real path, then
#: ``PATH\0WHERE\0KIND\0`` for at most $MAX_LINKS of them, WHERE the path it resolves to,
#: KIND what is there: ``d`` a directory, ``f`` a file, ``-`` nothing), and
#: ``blob:nested_changed=``
#: the files changed since then below the nested repositories of the baseline ($NESTED,
#: one per line). With $PACK_LIST, also ``blob:pack=`` as :data:`PACK` prints it, at most
#: $PACK_MAX bytes (one call for the listing and the protected files' bytes).
LIST = (
    r"""
cd "$REPO" || exit 3
set -o pipefail
links=()
if [ -n "${SINCE:-}" ]; then
  links=(-type l -newerct "@$SINCE" -fprintf "$TMPDIR/links" '%P\0')
fi
printf 'blob:list='
{
  find . \( -path ./.git/objects -o -path ./.git/refs -o -path ./.git/logs -o -path ./.git/lfs \
      -o -path ./.git/modules -o -path ./.git/worktrees \) -prune -o -printf '%y %P\0' \
      "${links[@]}" 2>"$TMPDIR/list.err" || exit 4
  info=.git/objects/info entries=(x)
  if [ -d "$info" ] && [ ! -L "$info" ]; then
    shopt -s nullglob dotglob; entries=("$info"/*); shopt -u nullglob dotglob
  fi
  # (an empty directory, as the scrub leaves it: its own line, as find prints it, no find)
  if [ "${#entries[@]}" -eq 0 ]; then printf 'd %s\0' "$info"
  elif [ -d "$info" ]; then find "$info" -printf '%y %p\0' 2>/dev/null; fi
  dirs=()
  for d in .git/refs .git/logs .git/modules .git/worktrees; do [ ! -d "$d" ] || dirs+=("$d"); done
  if [ "${#dirs[@]}" -gt 0 ]; then
    find "${dirs[@]}" \( -type f -o -type l \) __CODE__ -printf '%y %p\0' 2>/dev/null
  fi
  if [ -d .git/objects ]; then
    find .git/objects -path .git/objects/info -prune -o \( -type f -o -type l \) \
      ! -regex '\.git/objects/[0-9a-f][0-9a-f]/[0-9a-f]+' \
      ! -regex '\.git/objects/pack/\(pack-[0-9a-f]+\.[a-z]+\|multi-pack-index\|tmp_.*\)' \
      -printf '%y %p\0' 2>/dev/null
  fi
  if [ -d .git/lfs ]; then
    find .git/lfs \( -type f -o -type l \) \
      ! -regex '\.git/lfs/objects/[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/[0-9a-f]+' \
      ! -path '.git/lfs/tmp/*' ! -path '.git/lfs/cache/*' -printf '%y %p\0' 2>/dev/null
  fi
  true
} | base64 -w0 || { echo; cat "$TMPDIR/list.err"; exit 4; }
echo
if [ -n "${SINCE:-}" ]; then
  # (no link made since then, no nested repository: nothing to count or encode)
  if [ -s "$TMPDIR/links" ]; then
    printf 'links=%s\n' "$(tr -cd '\0' < "$TMPDIR/links" | wc -c)"
    printf 'blob:links='
    {
      printf '%s\0' "$(pwd -P)"
      head -z -n "${MAX_LINKS:-10000}" "$TMPDIR/links" | while IFS= read -r -d '' p; do
        where=$(realpath -m -- "$p" 2>/dev/null || readlink -f -- "$p" 2>/dev/null)
        if [ -d "$p" ]; then kind=d; elif [ -f "$p" ]; then kind=f; else kind=-; fi
        printf '%s\0%s\0%s\0' "$p" "$where" "$kind"
      done
    } | base64 -w0
    echo
  else
    printf 'links=0\nblob:links=\n'
  fi
  printf 'blob:nested_changed='
  if [ -n "${NESTED:-}" ]; then
    printf '%s\n' "$NESTED" | while IFS= read -r d; do
      [ -n "$d" ] && [ -d "./$d" ] || continue
      find "./$d" -path "./$d/.git" -prune -o ! -type d -newerct "@$SINCE" -printf '%p\0' \
        2>/dev/null
    done | head -z -n 100 | sed -z 's|^\./||' | base64 -w0
  fi
  echo
fi
if [ -n "${PACK_LIST:-}" ]; then
  : "${PACK_MAX:?}"
  printf 'blob:pack='
  # (as PACK: an unreadable file is missing from the pack, a change; at most $PACK_MAX bytes)
  { tar --null --no-recursion -T "$PACK_LIST" -cf - 2>/dev/null; true; } \
    | head -c "$PACK_MAX" | base64 -w0 || exit 4
  echo
fi
exit 0
"""
).replace("__CODE__", _find_names(CODE_PATTERNS))

#: ``blob:pack=``: a tar of the NUL-separated paths in $LIST, without recursing into
#: directories; its first $MAX bytes (tar stops reading there: a file the agent grew is
#: not read whole).
PACK = r"""
cd "$REPO" || exit 3
: "${MAX:?}"
printf 'blob:pack='
# tar's own status is not checked: an unreadable file is missing from the pack (a change).
{ tar --null --no-recursion -T "$LIST" -cf - 2>/dev/null; true; } | head -c "$MAX" \
  | base64 -w0 || exit 4
echo
exit 0
"""

#: Remove $REMOVE's paths, unpack $TAR (base64) over the tree, remove $RMDIRS if empty.
RESTORE = r"""
cd "$REPO" || exit 3
if [ -s "$REMOVE" ]; then xargs -0 rm -rf -- < "$REMOVE" || exit 4; fi
if [ -s "$TAR" ]; then base64 -d "$TAR" | tar -xf - || exit 5; fi
if [ -s "$RMDIRS" ]; then xargs -0 rmdir -- < "$RMDIRS" 2>/dev/null; fi
exit 0
"""

#: Remove every ref but the checked-out branch and the tags of HEAD and $BASE, remotes,
#: stashes and reflogs; then give the repository a new object store holding only what HEAD,
#: $BASE, the kept tags and the index need (one ``pack-objects`` with no delta search: its
#: cost is the tree's, not the history's), HEAD and $BASE marked shallow (their parents are
#: gone). Alternates go with the old store. A linked work tree (its store is shared) falls
#: back to ``gc --prune=now``.
SCRUB = r"""
cd "$REPO" || exit 3
# (PREPARE asks git for these four in one call and sets them; alone, they are asked here)
if [ -z "${gd:-}" ]; then
  gd=$(gitc rev-parse --absolute-git-dir 2>/dev/null) || { echo "not_a_repository=1"; exit 0; }
  head=$(gitc rev-parse -q --verify HEAD) || { echo "no_head=1"; exit 0; }
  base=$head
  if [ -n "$BASE" ]; then
    base=$(gitc rev-parse -q --verify "$BASE^{commit}" 2>/dev/null) || base=$head
  fi
  cur=$(gitc symbolic-ref -q HEAD || true)
fi
echo "head=$head"
[ "$head" = "$base" ] && echo "head_is_base=1"
# loose and packed objects, as count-objects -v counts them (read here: no awk)
objects() {
  local k v n=0
  while read -r k v; do case $k in count:|in-pack:) n=$((n + v)) ;; esac; done \
    < <(gitc count-objects -v)
  echo "$n"
}
before=$(objects)
gitc for-each-ref --format='%(objectname) %(*objectname) %(refname)' > "$TMPDIR/refs" || exit 4
awk -v cur="$cur" -v head="$head" -v base="$base" -v kept="$TMPDIR/tags.kept" '
  { peel = NF == 3 ? $2 : $1; ref = $NF }
  ref == cur { next }
  ref ~ /^refs\/tags\// && (peel == head || peel == base) { print $1 > kept; next }
  { print "delete " ref }
' "$TMPDIR/refs" > "$TMPDIR/refs.del" || exit 4
mapfile -t deleted < "$TMPDIR/refs.del"
kept=()
[ ! -f "$TMPDIR/tags.kept" ] || mapfile -t kept < "$TMPDIR/tags.kept"
if [ "${#deleted[@]}" -gt 0 ]; then
  gitc update-ref --no-deref --stdin < "$TMPDIR/refs.del" || exit 4
fi
for remote in $(gitc remote); do gitc remote remove "$remote" >/dev/null 2>&1; done
# (the reflogs of a repository whose git dir is its .git go with .git/logs)
[ -d .git ] && [ "$gd" -ef .git ] || gitc reflog expire --expire=now --all >/dev/null 2>&1
new="$gd/objects.scrub"
rm -rf .git/logs .git/refs/original .git/rr-cache .git/ORIG_HEAD .git/FETCH_HEAD \
  .git/MERGE_HEAD .git/CHERRY_PICK_HEAD .git/REVERT_HEAD .git/AUTO_MERGE .git/BISECT_LOG \
  .git/BISECT_START .git/BISECT_EXPECTED_REV "$new"
if [ ! -e "$gd/commondir" ] && [ -d "$gd/objects" ] && [ ! -L "$gd/objects" ]; then
  # A new object store with only what the kept commits, kept tags and the index name (one
  # pack: its cost is the tree's, not the history's); the old store goes whole.
  mkdir -p "$new/pack" "$new/info" || exit 5
  { gitc rev-list --objects --no-walk "$head" "$base" \
      && { [ "${#kept[@]}" -eq 0 ] || printf '%s\n' "${kept[@]}"; } \
      && gitc ls-files -s | awk '$1 != "160000" { print $2 }'; } > "$TMPDIR/objects" || exit 6
  gitc pack-objects -q --window=0 "$new/pack/pack" < "$TMPDIR/objects" > /dev/null || exit 6
  # shallow: the commits whose parents are gone (read from the object's header: a shallow
  # clone hides them from rev-parse), in order, once each
  commits=("$head")
  if [[ $base < $head ]]; then commits=("$base" "$head"); elif [[ $base > $head ]]; then
    commits+=("$base"); fi
  shallow=()
  for c in "${commits[@]}"; do
    header=$(gitc cat-file commit "$c") || continue
    header=$'\n'${header%%$'\n\n'*}
    case $header in *$'\n''parent '*) shallow+=("$c") ;; esac
  done
  rm -rf "$gd/objects" "$gd/shallow" && mv "$new" "$gd/objects" || exit 6
  if [ "${#shallow[@]}" -gt 0 ]; then printf '%s\n' "${shallow[@]}" > "$gd/shallow" || exit 6; fi
else
  if [ -s .git/objects/info/alternates ]; then
    gitc repack -a -d -q && rm -f .git/objects/info/alternates || exit 5
  fi
  gitc -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now gc --prune=now -q || exit 6
fi
after=$(objects)
echo "refs_removed=${#deleted[@]}"
echo "tags_kept=${#kept[@]}"
echo "objects_before=$before"
echo "objects_after=$after"
exit 0
"""

_TOOLCHAIN_PY = r"""
import importlib.util, os, site, sys
dirs = []
for get in (site.getsitepackages, site.getusersitepackages):
    try:
        found = get()
    except Exception:
        continue
    dirs += [found] if isinstance(found, str) else list(found)
out = set()
for d in dirs:
    if os.path.isdir(d):
        for name in os.listdir(d):
            if name.endswith('.pth') or name in ('sitecustomize.py', 'usercustomize.py'):
                out.add(os.path.join(d, name))
sys.path += [d for d in dirs if d not in sys.path]
for name in ('sitecustomize', 'usercustomize', 'pytest', '_pytest', 'pluggy', 'unittest', 'py'):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        continue
    if spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for here, _, files in os.walk(root):
                out.update(os.path.join(here, f) for f in files if f.endswith('.py'))
    else:
        out.add(spec.origin)
print('\n'.join(sorted(out)))
"""

#: A shell function: ``stat DEV INODE SIZE MTIME CTIME PATH`` for each path of the
#: NUL-separated list in file $1 that exists (of the file a symlink leads to; times to the
#: nanosecond). ctime cannot be set back without setting the clock, so a file whose key is
#: the same has the same content: the grader hashes only files whose key it has not seen.
STAT_FILES = r"""
stat_files() {
  xargs -0 -r sh -c \
    'find -L "$@" -maxdepth 0 -printf "stat %D %i %s %T@ %C@ %p\\n" 2>/dev/null; true' \
    stat_files < "$1"
}
"""

#: ``stat KEY PATH`` (:data:`STAT_FILES`), then ``hash PATH SHA256`` (``missing`` when it
#: cannot be read) for each path of the NUL-separated list in $LIST, then ``restat KEY
#: PATH``: a file whose key changed while it was read (or a symlink moved meanwhile) has two
#: keys, and its digest is not remembered.
HASH_FILES = (
    STAT_FILES
    + r"""
stat_files "$LIST"
declare -A sums=()
# One sha256sum for all the files; a name it escapes (a backslash), and one it did not
# read, is hashed on its own.
while IFS= read -r line; do
  case "$line" in \\*) ;; *) sums["${line#*  }"]=${line%%  *} ;; esac
done < <(xargs -0 -r sha256sum -- < "$LIST" 2>/dev/null)
while IFS= read -r -d '' file; do
  sum=${sums["$file"]:-}
  [ -n "$sum" ] || { sum=$(sha256sum < "$file" 2>/dev/null) || sum=missing; }
  printf 'hash %s %s\n' "$file" "${sum%% *}"
done < "$LIST"
stat_files "$LIST" | sed 's/^stat /restat /'
exit 0
"""
)

#: A shell function: ``find_word WORD`` sets $p to WORD as found on PATH (an absolute path)
#: and $real to its target; for a pyenv shim (a bash script that runs ``pyenv exec WORD``)
#: to the program pyenv picks for it here (its version files and PYENV_VERSION included),
#: with $shim the shim and $pyenv_root pyenv's root. Fails when WORD is not found.
FIND_WORD = r"""
find_word() {
  shim= pyenv_root= p=
  # as `command -v` finds it, without a subshell: a function or alias is not a program
  case "$1" in
    */*) [ -f "$1" ] && [ -x "$1" ] && p=$1 ;;
    *) declare -F -- "$1" >/dev/null || alias -- "$1" >/dev/null 2>&1 \
         || { hash -- "$1" 2>/dev/null && p=${BASH_CMDS[$1]}; } ;;
  esac
  [ -n "$p" ] || return 1
  # a path relative to where the tests run (./venv/bin/python) is that path from here
  case "$p" in /*) ;; */*) p=$PWD/$p ;; *) return 1 ;; esac
  real=$(readlink -f "$p")
  local start= pyenv_bin w
  IFS= read -r -N 2048 start 2>/dev/null < "$real"
  if [[ $start == *'/libexec/pyenv" exec '* ]]; then
    pyenv_bin=$(sed -n 's/^exec "\(.*\/libexec\/pyenv\)" exec .*/\1/p' "$real" | head -n 1)
    pyenv_root=$(sed -n 's/^export PYENV_ROOT="\(.*\)"$/\1/p' "$real" | head -n 1)
    if [ -x "$pyenv_bin" ] && w=$(PYENV_ROOT=$pyenv_root "$pyenv_bin" which "$1" 2>/dev/null) \
        && [ -n "$w" ]; then
      shim=$real p=$w real=$(readlink -f "$w")
    fi
  fi
  return 0
}
"""

#: ``bin NAME PATH`` for each tool on PATH, then ``stat KEY FILE`` (:data:`STAT_FILES`) for
#: the tools, the interpreters' start-up hooks (.pth, sitecustomize) and the test runners'
#: sources: their contents are hashed only where the grader has not seen that key
#: (:data:`HASH_FILES`).
TOOLCHAIN = (
    STAT_FILES
    + FIND_WORD
    + r"""
: > "$TMPDIR/files"
# Each tool as found on PATH (the hash table, no subshell), their targets in one readlink
names=() paths=() reals=()
for name in $TOOLS; do
  hash -- "$name" 2>/dev/null || continue
  p=${BASH_CMDS[$name]}
  case "$p" in /*) names+=("$name") paths+=("$p") ;; esac
done
if [ ${#paths[@]} -gt 0 ]; then
  mapfile -t -d '' reals < <(readlink -z -f -- "${paths[@]}" 2>/dev/null)
  if [ ${#reals[@]} -ne ${#paths[@]} ]; then  # one did not resolve: each on its own
    reals=()
    for p in "${paths[@]}"; do reals+=("$(readlink -f "$p")"); done
  fi
fi
for i in "${!names[@]}"; do
  printf 'bin %s %s\n' "${names[i]}" "${reals[i]}"
  printf '%s\0' "${reals[i]}" >> "$TMPDIR/files"
done
asked=
for py in python3 python; do
  find_word "$py" || continue  # a pyenv shim: the interpreter it runs (its start-up is dear)
  key="|${p%/*} $real|"  # python and python3 of one bin directory: one interpreter
  case "$asked" in *"$key"*) continue ;; esac
  asked=$asked$key
  "$p" -I -S -c "$PYCODE" 2>/dev/null | tr '\n' '\0' >> "$TMPDIR/files"
done
sort -zu "$TMPDIR/files" > "$TMPDIR/files.sorted"
stat_files "$TMPDIR/files.sorted"
exit 0
"""
)
TOOLCHAIN_PY = _TOOLCHAIN_PY

#: Tools whose binaries are checked (resolved on the grading PATH).
TOOLCHAIN_TOOLS = (
    "bash sh env timeout git python python3 pytest tar find xargs base64 sha256sum rm cat"
)

#: The agent's change as one binary-safe patch against $BASE: tracked and untracked files,
#: and ignored files that were not there at the baseline (NUL list $IGNORED, sorted); with
#: ``size=N``, then ``blob:patch=`` unless it is over $LIMIT bytes, ``blob:ignored_new=``
#: and ``blob:ignored_changed=`` (ignored files of the baseline changed since $SINCE, the
#: sandbox's epoch then). The repository's own index is left alone; the one built here stays
#: in $TMPDIR for :data:`DIFF_TEXT`. Replace refs are off (GIT_NO_REPLACE_OBJECTS).
DIFF = r"""
cd "$REPO" || exit 3
idx="$TMPDIR/index.grading"
out="$TMPDIR/patch.$$"
if [ -f .git/index ]; then cp -p .git/index "$idx" || exit 4; else rm -f "$idx"; fi
export GIT_INDEX_FILE="$idx"
gitc add -A . >/dev/null || exit 5
gitc ls-files -z -o -i --exclude-standard | LC_ALL=C sort -z > "$TMPDIR/ign.now" || exit 9
# (no ignored file now, or none at the baseline: nothing to compare, no process for it)
: > "$TMPDIR/ign.new"
: > "$TMPDIR/ign.changed"
if [ -s "$TMPDIR/ign.now" ]; then
  LC_ALL=C comm -z -23 "$TMPDIR/ign.now" "$IGNORED" > "$TMPDIR/ign.new" || exit 9
fi
if [ -s "$TMPDIR/ign.new" ]; then
  gitc --literal-pathspecs add -f --pathspec-from-file="$TMPDIR/ign.new" --pathspec-file-nul \
    >/dev/null || exit 5
fi
if [ -n "$SINCE" ] && [ -s "$TMPDIR/ign.now" ] && [ -s "$IGNORED" ]; then
  LC_ALL=C comm -z -12 "$TMPDIR/ign.now" "$IGNORED" | sed -z 's|^|./|' \
    | xargs -0 -r sh -c 'find "$@" -maxdepth 0 -newerct "@$0" -print0 2>/dev/null; true' "$SINCE" \
    | sed -z 's|^\./||' > "$TMPDIR/ign.changed"
fi
gitc diff --cached --binary --full-index --no-color --no-ext-diff --no-textconv --no-renames \
  "$BASE" > "$out" || exit 6
size=$(wc -c < "$out") || exit 7
echo "size=$size"
if [ "$size" -le "$LIMIT" ]; then printf 'blob:patch='; base64 -w0 < "$out" || exit 8; echo; fi
printf 'blob:ignored_new='; [ ! -s "$TMPDIR/ign.new" ] || base64 -w0 < "$TMPDIR/ign.new"; echo
printf 'blob:ignored_changed='
[ ! -s "$TMPDIR/ign.changed" ] || base64 -w0 < "$TMPDIR/ign.changed"
echo
rm -f "$out"
exit 0
"""

#: The NUL-separated paths in $LIST of :data:`DIFF`'s index diffed as text (``--text``: a
#: ``-diff`` attribute or a NUL byte does not hide their lines): ``blob:patch=``, at most
#: $LIMIT bytes of it.
DIFF_TEXT = r"""
cd "$REPO" || exit 3
export GIT_INDEX_FILE="$TMPDIR/index.grading"
[ -f "$GIT_INDEX_FILE" ] || exit 4
mapfile -d '' paths < "$LIST" || exit 5
set -o pipefail
printf 'blob:patch='
gitc --literal-pathspecs diff --cached --text --full-index --no-color --no-ext-diff \
  --no-textconv --no-renames "$BASE" -- "${paths[@]}" 2>"$TMPDIR/difftext.err" \
  | { head -c "$LIMIT"; cat > /dev/null; } | base64 -w0 \
  || { echo; cat "$TMPDIR/difftext.err"; exit 6; }
echo
exit 0
"""

#: ``tree=`` and the tree of HEAD (empty without one), then $PATCH (base64; none where $PATCH
#: is empty) applied to the work tree; exit 7 when it does not apply.
APPLY = r"""
cd "$REPO" || exit 3
printf 'tree=%s\n' "$(gitc rev-parse -q --verify 'HEAD^{tree}' 2>/dev/null)"
[ -n "$PATCH" ] && [ -s "$PATCH" ] || exit 0
base64 -d "$PATCH" > "$PATCH.diff" || exit 4
gitc apply --binary --whitespace=nowarn "$PATCH.diff" || exit 7
exit 0
"""

#: Where ``python3`` (or ``python``) on PATH is a pyenv shim: ``pyenv_shims=DIR`` (the shims'
#: directory) and ``pyenv_bins=DIR:...``, the ``bin`` directories of the versions pyenv picks
#: here (``pyenv version-name``: PYENV_VERSION, the version files from here up, the global
#: one), in its order up to the first ``system``. Put before the shims on PATH they give every
#: command they hold as ``pyenv which`` gives it (the first version that has it), and every
#: other command still goes through the shims. Nothing when the versions are not all
#: installed or pyenv is not there.
PYENV_PIN = r"""
pin_pyenv() {
  local p start bin root names name dirs= list
  if hash python3 2>/dev/null; then p=${BASH_CMDS[python3]}
  elif hash python 2>/dev/null; then p=${BASH_CMDS[python]}
  else return 0; fi
  case "$p" in /*/*) ;; *) return 0 ;; esac
  IFS= read -r -N 2048 start 2>/dev/null < "$p"
  [[ $start =~ exec\ \"([^\"]*/libexec/pyenv)\"\ exec\  ]] || return 0
  bin=${BASH_REMATCH[1]}
  [[ $start =~ export\ PYENV_ROOT=\"([^\"]+)\" ]] || return 0
  root=${BASH_REMATCH[1]}
  [ -x "$bin" ] || return 0
  names=$(PYENV_ROOT=$root "$bin" version-name 2>/dev/null) || return 0
  IFS=: read -r -a list <<< "$names"
  for name in "${list[@]}"; do
    [ "$name" = system ] && break
    case "$name" in ''|*/*|.|..) return 0 ;; esac
    [ -d "$root/versions/$name/bin" ] || return 0
    dirs=${dirs:+$dirs:}$root/versions/$name/bin
  done
  [ -n "$dirs" ] || return 0
  echo "pyenv_shims=${p%/*}"
  echo "pyenv_bins=$dirs"
}
"""

#: Everything the baseline reads in one call: ``missing=1`` when $REPO is not there; the
#: history scrub when $SCRUB is 1; ``head=`` and ``tree=`` (of $BASE, default HEAD); the
#: sandbox's ``epoch=`` (seconds); the listing of the tree (``blob:list=``, as :data:`LIST`)
#: and its ignored files (``blob:ignored=``, NUL-separated); first, what :data:`PYENV_PIN`
#: prints, asked in the repository.
PREPARE = (
    PYENV_PIN
    + r"""
cd "$REPO" 2>/dev/null || { echo "missing=1"; exit 0; }
pin_pyenv
# The git dir, HEAD, the base commit and its tree, HEAD's branch: one call where all resolve
# (the scrub keeps them), else each asked on its own as before.
gd= head= base= tree= cur=
if facts=$(gitc rev-parse --absolute-git-dir HEAD "${BASE:-HEAD}^{commit}" "${BASE:-HEAD}^{tree}" \
    --symbolic-full-name HEAD -- 2>/dev/null); then
  mapfile -t facts <<< "$facts"
  hex='^[0-9a-f]{40}([0-9a-f]{24})?$'
  if [ "${#facts[@]}" -eq 6 ] && [ "${facts[5]}" = -- ] && [[ ${facts[0]} == /* ]] \
      && [[ ${facts[1]} =~ $hex ]] && [[ ${facts[2]} =~ $hex ]] && [[ ${facts[3]} =~ $hex ]]
  then
    gd=${facts[0]} head=${facts[1]} base=${facts[2]} tree=${facts[3]} cur=${facts[4]}
    [ "$cur" != HEAD ] || cur=
  fi
fi
if [ "$SCRUB" = 1 ]; then
  ( __SCRUB__ ) || exit $?
fi
if [ -z "$gd" ]; then
  head=$(gitc rev-parse -q --verify HEAD 2>/dev/null)
  tree=$(gitc rev-parse -q --verify "${BASE:-HEAD}^{tree}" 2>/dev/null)
fi
[ -z "$head" ] || echo "head=$head"
[ -z "$tree" ] || echo "tree=$tree"
# (the shell's clock, to the microsecond: no `date` process; a decimal comma read as a point)
now=${EPOCHREALTIME:-}; now=${now/,/.}; [ -n "$now" ] || now=$(date +%s.%N)
echo "epoch=$now"
( __LIST__ ) || exit $?
printf 'blob:ignored='
{ gitc ls-files -z -o -i --exclude-standard 2>/dev/null; true; } | base64 -w0
echo
exit 0
"""
)

PREPARE = PREPARE.replace("__SCRUB__", SCRUB.replace("exit 0\n", "true\n")).replace(
    "__LIST__", LIST.replace("exit 0\n", "true\n")
)
