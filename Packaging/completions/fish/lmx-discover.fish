function __lmx-discover_should_offer_completions_for_flags_or_options -a expected_commands
    set -l non_repeating_flags_or_options $argv[2..]
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-discover_parse_tokens
    test "$commands" = "$expected_commands"; and return $non_repeating_flags_or_options_absent
end

function __lmx-discover_should_offer_completions_for_positional -a expected_commands positional_index_comparison expected_positional_index
    set -l non_repeating_flags_or_options
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-discover_parse_tokens
    test "$commands" = "$expected_commands" -a \( "$positional_index" "$positional_index_comparison" "$expected_positional_index" \)
end

function __lmx-discover_parse_tokens -S
    set -l unparsed_tokens (__lmx-discover_tokens -pc)
    switch $unparsed_tokens[1]
    case 'lmx-discover'
        __lmx-discover_parse_subcommand 0 'json' 'p/parsable' 'r' 't' 'a' 'watch' 'timeout=' 'i/interface=+' 'exclude-interface=+' 'all-interfaces' '4' '6' 'probe' 'probe-timeout=' 'type=' 'd/domain=' 'host=+' 'doctor' 'h/help'
        switch $unparsed_tokens[1]
        case 'help'
            __lmx-discover_parse_subcommand -r 1 
        end
    end
end

function __lmx-discover_tokens
    if test (string split -m 1 -f 1 -- . "$FISH_VERSION") -gt 3
        commandline --tokens-raw $argv
    else
        commandline -o $argv
    end
end

function __lmx-discover_parse_subcommand -S -a positional_count
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

function __lmx-discover_complete_directories
    set -l token (commandline -t)
    string match -- '*/' $token
    set -l subdirs $token*/
    printf %s\n $subdirs
end

function __lmx-discover_custom_completion
    set -x SAP_SHELL fish
    set -x SAP_SHELL_VERSION $FISH_VERSION
    set -l tokens (__lmx-discover_tokens -p)
    if test -z "$(__lmx-discover_tokens -t)"
        set -l index (count (__lmx-discover_tokens -pc))
        set tokens $tokens[..$index] \'\' $tokens[(math $index + 1)..]
    end
    command $tokens[1] $argv $tokens
end

complete -c 'lmx-discover' -f
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" json' -l 'json' -d 'Print one JSON array of servers.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" p parsable' -s 'p' -l 'parsable' -d 'Print avahi-browse -rtp resolved lines (=;iface;proto;name;type;domain;host;address;port;txt).'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" r' -s 'r' -d 'Resolve (always done; accepted as in avahi-browse).'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" t' -s 't' -d 'Exit after the listing (the default without --watch; accepted as in avahi-browse).'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" a' -s 'a' -d 'All services (lmx-discover browses its one type; accepted as in avahi-browse).'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" watch' -l 'watch' -d 'Keep running; print one JSON object per event (added, updated, removed, daemon) until SIGINT or SIGTERM.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" timeout' -l 'timeout' -d 'Seconds to wait for a complete listing.' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover"' -s 'i' -l 'interface' -d 'Only use this interface (repeatable; globs like \'en*\').' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover"' -l 'exclude-interface' -d 'Leave out this interface (repeatable; globs).' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" all-interfaces' -l 'all-interfaces' -d 'Also use container, VM and VPN interfaces (docker*, veth*, br-*, virbr*, tun*, tap*), left out by default.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" 4' -s '4' -d 'IPv4 only.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" 6' -s '6' -d 'IPv6 only.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" probe' -l 'probe' -d 'Probe every server by the LMX contract and add verdict, version, instance_id, models and latency.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" probe-timeout' -l 'probe-timeout' -d 'Per-request probe timeout.' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" type' -l 'type' -d 'The DNS-SD service type.' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" d domain' -s 'd' -l 'domain' -d 'The browse domain (default: local).' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover"' -l 'host' -d 'Ask this address by the LMX contract and show what the server says (repeatable; port 1234 when none).' -rfka ''
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" doctor' -l 'doctor' -d 'Check why no server is found and say what to do; with --host, also ask those addresses.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_flags_or_options "lmx-discover" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-discover' -n '__lmx-discover_should_offer_completions_for_positional "lmx-discover" -eq 1' -fa 'help' -d 'Show subcommand help information.'
