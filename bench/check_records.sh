#!/usr/bin/env bash
# Checks the benchmark records (a CTest test, bench_records_check; also by hand from anywhere):
#   - every `bench/results/...` path named in a tracked file exists (a glob: matches something),
#     and every `<commit>:bench/results/...` one exists in that commit (where git history is here);
#   - every summary or plot named by file name alone (`<subject>_<date>...md` / `.png`) exists;
#   - bench/results/ holds at most 60 files and its INDEX.md;
#   - every summary INDEX.md names exists.
#   usage: bash bench/check_records.sh [REPO_ROOT]
set -uo pipefail
root=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
cd "$root" || exit 2
fail=0
bad() { echo "check_records: $*" >&2; fail=1; }

if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  have_git=1
  mapfile -t files < <(git ls-files)
else
  have_git=0
  mapfile -t files < <(find . -type f -not -path './.git/*' -not -path './build*' \
    -not -path './bench/out/*' -not -path './.devlibs*' | sed 's|^\./||')
fi

n=0
while IFS= read -r ref; do
  n=$((n + 1))
  path=${ref#*:}
  if [[ $ref == *:* ]]; then  # <commit>:bench/results/<file>: kept by history, not the tree
    commit=${ref%%:*}
    if [[ $have_git == 1 ]] && git cat-file -e "$commit^{commit}" 2> /dev/null &&
       ! git cat-file -e "$ref" 2> /dev/null; then
      bad "$ref: not in commit $commit"
    fi
    continue
  fi
  if [[ $path == *'*'* ]]; then
    compgen -G "$path" > /dev/null || bad "$path: matches nothing"
  elif [[ ! -e $path ]]; then
    bad "$path: named but not in the tree"
  fi
done < <(printf '%s\0' "${files[@]}" | xargs -0 grep -I -o -h -E \
  '([0-9a-f]{7,40}:)?bench/results/[A-Za-z0-9_.*-]*[A-Za-z0-9_*]' 2> /dev/null | sort -u)

# Summaries named by file name alone (README, docs, sources, other summaries): subject_date*.md/.png.
while IFS= read -r name; do
  n=$((n + 1))
  [[ -f bench/results/$name ]] || bad "$name: named but not in bench/results"
done < <(printf '%s\0' "${files[@]}" | xargs -0 grep -I -o -h -E \
  '[a-z0-9_.-]+_20[0-9]{2}-[0-9]{2}-[0-9]{2}[A-Za-z0-9_.-]*\.(md|png)' 2> /dev/null | sort -u)

count=$(find bench/results -type f | wc -l)
(( count <= 60 )) || bad "bench/results holds $count files (at most 60)"
[[ -f bench/results/INDEX.md ]] || bad "bench/results/INDEX.md is missing"
# shellcheck disable=SC2016  # (the backticks are markdown's)
while IFS= read -r md; do
  [[ -f bench/results/$md ]] || bad "INDEX.md names $md, which is not in bench/results"
done < <(grep -o -E '`[A-Za-z0-9_.-]+\.md`' bench/results/INDEX.md 2> /dev/null | tr -d '`' | sort -u)

echo "check_records: $n distinct references, $count files in bench/results"
exit $fail
