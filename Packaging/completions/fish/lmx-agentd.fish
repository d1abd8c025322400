function __lmx-agentd_should_offer_completions_for_flags_or_options -a expected_commands
    set -l non_repeating_flags_or_options $argv[2..]
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-agentd_parse_tokens
    test "$commands" = "$expected_commands"; and return $non_repeating_flags_or_options_absent
end

function __lmx-agentd_should_offer_completions_for_positional -a expected_commands positional_index_comparison expected_positional_index
    set -l non_repeating_flags_or_options
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-agentd_parse_tokens
    test "$commands" = "$expected_commands" -a \( "$positional_index" "$positional_index_comparison" "$expected_positional_index" \)
end

function __lmx-agentd_parse_tokens -S
    set -l unparsed_tokens (__lmx-agentd_tokens -pc)
    switch $unparsed_tokens[1]
    case 'lmx-agentd'
        __lmx-agentd_parse_subcommand 0 'socket=' 'db=' 'config=' 'endpoint=+' 'no-discovery' 'i/interface=+' 'doctor-interface=+' 'extra-ca-file=' 'log-level=' 'gateway=' 'gateway-socket=' 'no-gateway' 'metrics-address=' 'address-book=+' 'version' 'h/help'
        switch $unparsed_tokens[1]
        case 'help'
            __lmx-agentd_parse_subcommand -r 1 'version'
        end
    end
end

function __lmx-agentd_tokens
    if test (string split -m 1 -f 1 -- . "$FISH_VERSION") -gt 3
        commandline --tokens-raw $argv
    else
        commandline -o $argv
    end
end

function __lmx-agentd_parse_subcommand -S -a positional_count
    argparse -s r -- $argv
    set -l option_specs $argv[2..]
    set -l is_repeating_positional $_flag_r
    set -el _flag_r
    set -a commands $unparsed_tokens[1]
    set positional_index 0
    while true
        set -e unparsed_tokens[1]
        argparse -sn "$commands" $option_specs -- $unparsed_tokens 2> /dev/null
        set unparsed_tokens $argv
        set positional_index (math $positional_index + 1)
        for non_repeating_flag_or_option in $non_repeating_flags_or_options
            if set -ql "_flag_$(string replace -a - _ -- $non_repeating_flag_or_option)"
                set non_repeating_flags_or_options_absent 1
                break
            end
        end
        test (count $unparsed_tokens) -eq 0 -o \( -z "$is_repeating_positional" -a "$positional_index" -gt "$positional_count" \) && break
    end
end

function __lmx-agentd_complete_directories
    set -l token (commandline -t)
    string match -- '*/' $token
    set -l subdirs $token*/
    printf %s\n $subdirs
end

function __lmx-agentd_custom_completion
    set -x SAP_SHELL fish
    set -x SAP_SHELL_VERSION $FISH_VERSION
    set -l tokens (__lmx-agentd_tokens -p)
    if test -z "$(__lmx-agentd_tokens -t)"
        set -l index (count (__lmx-agentd_tokens -pc))
        set tokens $tokens[..$index] \'\' $tokens[(math $index + 1)..]
    end
    command $tokens[1] $argv $tokens
end

complete -c 'lmx-agentd' -f
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" socket' -l 'socket' -d 'Unix socket to serve the status API on.' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" db' -l 'db' -d 'SQLite database file.' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" config' -l 'config' -d 'JSON config file (absent: defaults).' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd"' -l 'endpoint' -d 'A manual endpoint, scheme://host[:port] (repeatable). https:// is treated as WAN, http:// as LAN.' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" no-discovery' -l 'no-discovery' -d 'Do not browse mDNS; use only paired and configured endpoints.'
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd"' -s 'i' -l 'interface' -d 'Only these interfaces for mDNS (glob, repeatable).' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd"' -l 'doctor-interface' -d 'Interfaces on which the discovery checks may ask the link directly while nothing is usable (glob, repeatable; default: those of mDNS).' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" extra-ca-file' -l 'extra-ca-file' -d 'PEM file of extra trusted CAs for HTTPS endpoints.' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" log-level' -l 'log-level' -d 'trace, debug, info, notice, warning or error.' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" gateway' -l 'gateway' -d 'The local OpenAI-compatible gateway\'s TCP address, loopback only (default 127.0.0.1:1235), or off.' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" gateway-socket' -l 'gateway-socket' -d 'The gateway\'s Unix socket (default: gateway.sock beside the status socket).' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" no-gateway' -l 'no-gateway' -d 'Do not serve the local gateway at all.'
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" metrics-address' -l 'metrics-address' -d 'Also serve /metrics over TCP for Prometheus, e.g. 127.0.0.1:9466 (default: only on the socket).' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd"' -l 'address-book' -d 'An lmx-connections.json address book to follow: a rewritten tunnel URL updates its pairing (repeatable).' -rfka ''
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_positional "lmx-agentd" -eq 1' -fa 'help' -d 'Show subcommand help information.'
complete -c 'lmx-agentd' -n '__lmx-agentd_should_offer_completions_for_flags_or_options "lmx-agentd help" version' -l 'version' -d 'Show the version.'
