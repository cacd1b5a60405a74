"""A local TCP proxy in front of a server, whose connections a test breaks at will (`cut`): a
connection that fails under the calls it carries (a GOAWAY, a reset, a middlebox), while the server
stays up and takes new connections through the proxy. `freeze` makes them fall silent instead, as a
peer lost without a reset (a host gone, a partition, a dropped NAT entry) looks to its reader."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0  # accepted so far
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # both ends of every piped connection
        self._frozen: set[asyncio.StreamWriter] = set()  # ends nothing is written to any more

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _pipe(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        ends = {client_writer, server_writer}
        self._open |= ends

        async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await reader.read(65536):
                    if writer not in self._frozen:
                        writer.write(data)
                        await writer.drain()

        try:
            await asyncio.gather(copy(client_reader, server_writer), copy(server_reader, client_writer))
        finally:
            for writer in ends:
                writer.transport.abort()
            self._open -= ends
            self._frozen -= ends

    def freeze(self) -> None:
        """Every open connection falls silent both ways, its sockets left open; new ones still pass."""
        self._frozen |= self._open

    def cut(self) -> None:
        """Break every open connection at once (both ends closed, no goodbye)."""
        for writer in list(self._open):
            writer.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
