# `make install PREFIX=/usr/local DESTDIR=`: the headers, pkg-config files (distmesh.pc, and
# distmesh-tcp.pc which adds -DDISTMESH_TCP) and a CMake package (distmesh::distmesh, ::store,
# ::tcp, ::nccl). Header-only: nothing is compiled. `make uninstall` removes the same files.
PREFIX  ?= /usr/local
DESTDIR ?=
INCLUDEDIR ?= $(PREFIX)/include
LIBDIR  ?= $(PREFIX)/lib
DM_VERSION := $(shell sed -n 's/^\#define DISTMESH_VERSION "\(.*\)"/\1/p' distmesh.h)
DM_VMAJOR  := $(word 1,$(subst ., ,$(DM_VERSION)))
DM_VMINOR  := $(word 2,$(subst ., ,$(DM_VERSION)))
DM_HEADERS := $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h distmesh_nccl.h
DM_SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(DM_VERSION)|g' \
               -e 's|@MAJOR@|$(DM_VMAJOR)|g' -e 's|@MINOR@|$(DM_VMINOR)|g'

.PHONY: install uninstall
install:
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(LIBDIR)/cmake/distmesh
	install -m 644 $(DM_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	$(DM_SUBST) packaging/distmesh.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/distmesh.pc
	$(DM_SUBST) packaging/distmesh-tcp.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/distmesh-tcp.pc
	install -m 644 packaging/distmesh-config.cmake $(DESTDIR)$(LIBDIR)/cmake/distmesh/
	$(DM_SUBST) packaging/distmesh-config-version.cmake.in > $(DESTDIR)$(LIBDIR)/cmake/distmesh/distmesh-config-version.cmake
	@echo "installed distmesh $(DM_VERSION) under $(DESTDIR)$(PREFIX)"

uninstall:
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(DM_HEADERS))
	rm -f $(DESTDIR)$(LIBDIR)/pkgconfig/distmesh.pc $(DESTDIR)$(LIBDIR)/pkgconfig/distmesh-tcp.pc
	rm -rf $(DESTDIR)$(LIBDIR)/cmake/distmesh
