"""Variables that name the person's sockets are not passed to a confined agent
unless ``--allow-write`` names the socket (docs/protocol.md §13, issue 36)."""

from __future__ import annotations

from pathlib import Path

from prohost.engine.agent.environment import without_sockets

PERSON = {
    "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.123",
    "GPG_AGENT_INFO": "/run/user/1000/gnupg/S.gpg-agent:0:1",
    "TMUX": "/tmp/tmux-1000/default,4242,0",
    "TMUX_PANE": "%3",
    "STY": "4242.pts-0.host",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "WAYLAND_DISPLAY": "wayland-0",
    "DISPLAY": ":0",
    "DOCKER_HOST": "unix:///run/user/1000/docker.sock",
    "PATH": "/usr/bin",
    "LANG": "C.UTF-8",
}


def test_none_is_passed_without_a_grant() -> None:
    assert without_sockets(PERSON, ()) == {"PATH": "/usr/bin", "LANG": "C.UTF-8"}


def test_a_docker_host_over_tcp_names_no_socket_and_is_passed() -> None:
    env = {"DOCKER_HOST": "tcp://build.example:2376"}
    assert without_sockets(env, ()) == env


def test_allow_write_of_the_socket_or_its_folder_passes_its_variable() -> None:
    kept = without_sockets(PERSON, (Path("/tmp/ssh-XXXX/agent.123"), Path("/run/user/1000/bus"),
                                    Path("/tmp/tmux-1000")))
    assert kept["SSH_AUTH_SOCK"] == PERSON["SSH_AUTH_SOCK"]
    assert kept["DBUS_SESSION_BUS_ADDRESS"] == PERSON["DBUS_SESSION_BUS_ADDRESS"]
    assert kept["TMUX"] == PERSON["TMUX"] and kept["TMUX_PANE"] == "%3"
    assert "XDG_RUNTIME_DIR" not in kept and "DOCKER_HOST" not in kept
    assert "DISPLAY" not in kept and "WAYLAND_DISPLAY" not in kept
    everything = without_sockets(PERSON, (Path("/run/user/1000"), Path("/tmp/.X11-unix")))
    assert {"XDG_RUNTIME_DIR", "WAYLAND_DISPLAY", "DOCKER_HOST", "GPG_AGENT_INFO",
            "DBUS_SESSION_BUS_ADDRESS", "DISPLAY"} <= set(everything)
    assert "SSH_AUTH_SOCK" not in everything
