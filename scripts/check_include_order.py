#!/usr/bin/env python3
"""Compares what the preprocessor emits of distmesh's own headers in two translation units: the
implementation included first (distmesh.c) and after other system headers (tests/test_include_after.c).
The code must be the same, token for token, except for distmesh.h >>libc's (and distmesh_shm.h
>>shm libc's) declarations of the functions glibc hid in the second: a difference means some code
depends on the include order (an #ifdef on a GNU-only macro, a function left undeclared).
Usage: check_include_order.py first.i after.i   (gcc -E output; exit 1 on a difference)."""
import re
import sys

LINEMARK = re.compile(r'^# \d+ "([^"]+)"')
TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|\w+|\S')
OWN_DECL = re.compile(r'\bextern (?:int|long|ssize_t) \w+ ?\([^;]*\);')


def distmesh_tokens(path):
    """The tokens of the lines that come from distmesh*.h, minus the >>libc declarations."""
    cur, out = None, []
    with open(path, encoding='utf-8', errors='replace') as f:
        for line in f:
            m = LINEMARK.match(line)
            if m:
                cur = m.group(1)
                continue
            name = cur.rsplit('/', 1)[-1] if cur else ''
            if name.startswith('distmesh') and name.endswith('.h'):
                out.append(line.strip())
    text = OWN_DECL.sub(' ', ' '.join(out)).replace('"./distmesh', '"distmesh')   # __FILE__ in assert
    return TOKEN.findall(text)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    a, b = distmesh_tokens(sys.argv[1]), distmesh_tokens(sys.argv[2])
    if not a:
        print('check_include_order: no distmesh lines in %s' % sys.argv[1])
        return 1
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            print('check_include_order: the implementation differs by include order at token %d:' % i)
            print('  first: ' + ' '.join(a[max(0, i - 20):i + 20]))
            print('  after: ' + ' '.join(b[max(0, i - 20):i + 20]))
            return 1
    if len(a) != len(b):
        print('check_include_order: %d tokens included first, %d after' % (len(a), len(b)))
        return 1
    print('check_include_order: %d tokens, the same in both orders' % len(a))
    return 0


if __name__ == '__main__':
    sys.exit(main())
