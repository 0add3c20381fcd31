#!/usr/bin/env python3
"""Checks the cold regions of the headers (distmesh.h >>compile cost): the code between
_DM_COLD_BEGIN and _DM_COLD_END compiles as for debugging (gcc -Og, clang optnone), and a function
there is never inlined into a caller outside it. So:
  1. the markers alternate BEGIN, END, ... in each header, inside its implementation, none open at
     its end;
  2. no function defined in hot code is declared in a cold region (gcc would give it the region's
     optimize attribute, and g++ refuses one that differs from the definition's when it comes
     after); a forward declaration in hot code of a cold function is fine;
  3. hot code (outside the regions) calls a cold function only where ALLOWED says why: a path taken
     at create, at a collective's first call, for a split or on a failure, never per call or per byte.
     (The error macros, _DM_FAIL / _DM_REPORT / _DM_LOG, are such paths by definition.)
  4. the regions nest as gcc's option pushes and pops must: the warm regions (_DM_WARM_BEGIN /
     _END: the per-call code, without -O3's loop transforms) outside every other push, every
     push closed by the end of its header's implementation.
A new hot-to-cold call fails the check: move the callee out of its cold region, or, when the call
is on such a path, add it to ALLOWED with the reason.
With --ir FILE (clang -O2 -S -emit-llvm of the implementation), it also checks that the regions
took effect: every function of a cold region that FILE defines is optnone, and no other one is.
Usage: check_cold.py [--ir FILE] [SRCDIR]   (exit 1 on a problem)"""
import os
import re
import sys

HEADERS = ['distmesh.h', 'distmesh_kernels.h', 'distmesh_trace.h', 'distmesh_core.h', 'distmesh_engine.h',
           'distmesh_schedules.h', 'distmesh_thread.h', 'distmesh_shm.h', 'distmesh_store.h', 'distmesh_socket.h', 'distmesh_tcp.h',
           'distmesh_nccl.h']

# No regions there yet: the NCCL backend compiles at the includer's level whole, and its calls into
# the core's and the store's cold code are its create and shrink paths.
UNCHECKED = {'distmesh_nccl.h'}

# callee -> why hot code may call it
ALLOWED = {
    '_dm_cfg_int_logged': 'trace: read once, when a collective\'s flight recorder is made',
    '_dm_cfg_str_logged': 'trace: read once, when a collective\'s flight recorder is made',
    '_dm_cfg_int': 'DISTMESH_ALGO, read at create',
    '_dm_cfg_str': 'DISTMESH_HOST_LINK, read at create',
    '_dm_cfg_timeout': 'dm_set_timeout(c, 0): the default read again, not a collective',
    '_dm_peers_keep': 'the threaded world\'s layout, at create and split',
    '_dm_trace_closing': 'dm_destroy',
    '_dm_trace_release': 'dm_destroy',
    '_dm_trace_adopt': 'split, shrink and grow results join the flight recorder',
    '_dm_trace_rank_new': 'a collective\'s first operation',
    '_dm_trace_group_new': 'a collective\'s first operation',
    '_dm_trace_dump_rank': 'a failure (timeout, abort, lost peer, mismatch) or SIGUSR1',
    '_dm_trace_sig_start': 'a collective\'s first operation, with DISTMESH_DUMP_ON_SIGUSR1=1',
    '_dm_tw_member_new': 'dm_split of the threaded world',
    '_dm_st_random': 'the shared segment\'s nonce, at create',
    '_dm_run_gather_objects': 'object collectives: sizes and blobs, not a per-byte path',
    '_dm_run_broadcast_objects': 'object collectives: sizes and blobs, not a per-byte path',
    '_dm_eng_break': 'a failure: the group breaks and tells the others',
    '_dm_eng_adopt': 'a failure another rank posted, adopted',
    '_dm_eng_adopt_notice': 'a peer hung up: its notice, if any, is read',
    'dm_shrink': 'named in messages only ("dm_shrink(DM_SHRINK_ABORT)"), never called from hot code',
}

DEF = re.compile(r'^(?:_DM_PRIVATE|static|DM_API_IMPL|_DM_NORETURN DM_API_IMPL)\b[^;{=]*?\b(\w+)\s*\(([^;{]*?)\)\s*\{',
                 re.M | re.S)
DECL = re.compile(r'^(?:_DM_PRIVATE|static)\b[^;{=()]*?\b(\w+)\s*\([^;{]*?\)\s*;', re.M | re.S)
MARK = re.compile(r'^(_DM_COLD_BEGIN|_DM_COLD_END)\s*$', re.M)


def impl_part(text):
    """The implementation: from its once-guard to the end of the file."""
    m = re.search(r'^#define DISTMESH_\w*IMPL_INCLUDED\s*$', text, re.M)
    return (text[:m.end()].count('\n'), text[m.end():]) if m else (0, '')


def body_end(text, i):
    depth = 1
    while depth and i < len(text):
        c = text[i]
        if c == '{':
            depth += 1
        elif c == '}':
            depth -= 1
        i += 1
    return i


def check_ir(path, defs, problems):
    """Functions FILE defines, optnone or not, against the regions they sit in."""
    text = open(path, encoding='utf-8', errors='replace').read()
    optnone = set(m.group(1) for m in re.finditer(r'^attributes (#\d+) = \{[^}]*\boptnone\b', text, re.M))
    seen = 0
    for m in re.finditer(r'^define [^@]*@(\w+)\(.*?\)[^{#]*(#\d+)[^{]*\{', text, re.M):
        name, attr = m.group(1), m.group(2)
        if name not in defs or defs[name][0] == 'distmesh_nccl.h':
            continue
        seen += 1
        if defs[name][1] != (attr in optnone):
            problems.append('%s: %s is %s in the IR, but sits in %s code' % (
                path, name, 'optnone' if attr in optnone else 'optimised', 'cold' if defs[name][1] else 'hot'))
    if seen < 100:
        problems.append('%s: only %d of distmesh\'s functions found' % (path, seen))
    return seen


NEST = re.compile(r'^(_DM_COLD_BEGIN|_DM_COLD_END|_DM_WARM_BEGIN|_DM_WARM_END|#pragma GCC push_options'
                  r'|#pragma GCC pop_options)\b', re.M)


def check_nesting(h, base_line, impl):
    """The regions are gcc option pushes and pops, so they must nest: the warm regions sit outside
    every other push (the cold regions open inside them; the float semantics region and the
    kernels' -O3 sit between warm regions), and every one is closed by the end of the header's
    implementation (an open one would hand its options to the includer's own code)."""
    problems, stack = [], []
    for m in NEST.finditer(impl):
        line = base_line + impl[:m.start()].count('\n') + 1
        what = m.group(1)
        if what == '_DM_WARM_BEGIN' and stack:
            problems.append('%s:%d: _DM_WARM_BEGIN inside %s' % (h, line, stack[-1]))
        if what.endswith('BEGIN') or what.endswith('push_options'):
            stack.append(what)
            continue
        want = {'_DM_COLD_END': '_DM_COLD_BEGIN', '_DM_WARM_END': '_DM_WARM_BEGIN'}.get(what, '#pragma GCC push_options')
        if not stack or stack[-1] != want:
            problems.append('%s:%d: %s closes %s' % (h, line, what, stack[-1] if stack else 'nothing'))
        if stack:
            stack.pop()
    if stack:
        problems.append('%s: %s still open at the end of the implementation' % (h, stack[-1]))
    return problems


def main():
    args = sys.argv[1:]
    ir = None
    if len(args) >= 2 and args[0] == '--ir':
        ir, args = args[1], args[2:]
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    problems = []
    defs = {}                    # name -> (header, cold)
    decls = []                   # (name, header, cold, line)
    hot_bodies = []              # (header, name, body)
    for h in HEADERS:
        path = os.path.join(src, h)
        if not os.path.exists(path):
            continue
        text = open(path, encoding='utf-8').read()
        base_line, impl = impl_part(text)
        for m in MARK.finditer(text[:len(text) - len(impl)]):
            problems.append('%s:%d: %s outside the implementation' % (h, text[:m.start()].count('\n') + 1, m.group(1)))
        problems += check_nesting(h, base_line, impl)
        # regions: a list of (start, end, cold)
        cold, start, regions = False, 0, []
        for m in MARK.finditer(impl):
            line = base_line + impl[:m.start()].count('\n') + 1
            want = '_DM_COLD_END' if cold else '_DM_COLD_BEGIN'
            if m.group(1) != want:
                problems.append('%s:%d: %s where %s was expected' % (h, line, m.group(1), want))
                continue
            regions.append((start, m.start(), cold))
            cold, start = not cold, m.end()
        regions.append((start, len(impl), cold))
        if cold:
            problems.append('%s: a cold region is still open at the end of the implementation' % h)

        def cold_at(pos):
            for a, b, c in regions:
                if a <= pos < b:
                    return c
            return False
        for m in DEF.finditer(impl):
            name, end = m.group(1), body_end(impl, m.end())
            c = cold_at(m.start())
            defs[name] = (h, c)
            if not c:
                hot_bodies.append((h, name, impl[m.start():end]))
        for m in DECL.finditer(impl):
            decls.append((m.group(1), h, cold_at(m.start()), base_line + impl[:m.start()].count('\n') + 1))
    for name, h, c, line in decls:
        if name in defs and c and not defs[name][1]:
            problems.append('%s:%d: %s is declared in a cold region but defined in hot code' % (h, line, name))
    for h, caller, body in hot_bodies:
        if h in UNCHECKED:
            continue
        for callee in sorted(set(re.findall(r'\b(\w+)\s*\(', body))):
            if callee != caller and callee in defs and defs[callee][1] and callee not in ALLOWED:
                problems.append('%s: %s (hot) calls %s, which sits in a cold region (%s): move it out of '
                                'the region, or say in ALLOWED why the call is off the hot path'
                                % (h, caller, callee, defs[callee][0]))
    if ir:
        print('check_cold: %d functions of the IR checked' % check_ir(ir, defs, problems))
    for p in problems:
        print('check_cold: ' + p)
    ncold = sum(1 for v in defs.values() if v[1])
    print('check_cold: %d functions, %d in cold regions, %d problem(s)' % (len(defs), ncold, len(problems)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
