function __lmx-pair_should_offer_completions_for_flags_or_options -a expected_commands
    set -l non_repeating_flags_or_options $argv[2..]
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-pair_parse_tokens
    test "$commands" = "$expected_commands"; and return $non_repeating_flags_or_options_absent
end

function __lmx-pair_should_offer_completions_for_positional -a expected_commands positional_index_comparison expected_positional_index
    set -l non_repeating_flags_or_options
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-pair_parse_tokens
    test "$commands" = "$expected_commands" -a \( "$positional_index" "$positional_index_comparison" "$expected_positional_index" \)
end

function __lmx-pair_parse_tokens -S
    set -l unparsed_tokens (__lmx-pair_tokens -pc)
    switch $unparsed_tokens[1]
    case 'lmx-pair'
        __lmx-pair_parse_subcommand 0 'version' 'h/help'
        switch $unparsed_tokens[1]
        case 'import'
            __lmx-pair_parse_subcommand -r 1 'host=+' 'dry-run' 'probe' 'probe-timeout=' 'code=' 'allow-insecure' 'json' 'db=' 'socket=' 'version' 'h/help'
        case 'list'
            __lmx-pair_parse_subcommand 0 'json' 'db=' 'socket=' 'version' 'h/help'
        case 'remove'
            __lmx-pair_parse_subcommand 1 'db=' 'socket=' 'version' 'h/help'
        case 'export'
            __lmx-pair_parse_subcommand 1 'png=' 'terminal' 'db=' 'socket=' 'version' 'h/help'
        case 'help'
            __lmx-pair_parse_subcommand -r 1 'version'
        end
    end
end

function __lmx-pair_tokens
    if test (string split -m 1 -f 1 -- . "$FISH_VERSION") -gt 3
        commandline --tokens-raw $argv
    else
        commandline -o $argv
    end
end

function __lmx-pair_parse_subcommand -S -a positional_count
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

function __lmx-pair_complete_directories
    set -l token (commandline -t)
    string match -- '*/' $token
    set -l subdirs $token*/
    printf %s\n $subdirs
end

function __lmx-pair_custom_completion
    set -x SAP_SHELL fish
    set -x SAP_SHELL_VERSION $FISH_VERSION
    set -l tokens (__lmx-pair_tokens -p)
    if test -z "$(__lmx-pair_tokens -t)"
        set -l index (count (__lmx-pair_tokens -pc))
        set tokens $tokens[..$index] \'\' $tokens[(math $index + 1)..]
    end
    command $tokens[1] $argv $tokens
end

complete -c 'lmx-pair' -f
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_positional "lmx-pair" -eq 1' -fa 'import' -d 'Import pairings from QR images, text files, address books or standard input (-).'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_positional "lmx-pair" -eq 1' -fa 'list' -d 'List pairings (secrets are shown as set, never their values).'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_positional "lmx-pair" -eq 1' -fa 'remove' -d 'Remove a pairing; the agent drops its endpoints at once.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_positional "lmx-pair" -eq 1' -fa 'export' -d 'Show a pairing as a QR code to carry it to another machine (it holds the secrets).'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_positional "lmx-pair" -eq 1' -fa 'help' -d 'Show subcommand help information.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import"' -l 'host' -d 'Ask this address by the LMX contract, show what the server says, and pair it (repeatable; port 1234 when none).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" dry-run' -l 'dry-run' -d 'Show what would be imported; write nothing.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" probe' -l 'probe' -d 'Wait for the agent\'s verdict on the new endpoints and print it.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" probe-timeout' -l 'probe-timeout' -d 'How long --probe waits, in seconds.' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" code' -l 'code' -d 'Which code to import when an image holds several, counting from 1.' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" allow-insecure' -l 'allow-insecure' -d 'Accept plain http:// tunnels (private test setups only: keys travel unencrypted).'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" json' -l 'json' -d 'Print the result as JSON.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" db' -l 'db' -d 'The agent\'s database (default: as lmx-agentd; LMX_DB).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" socket' -l 'socket' -d 'The agent\'s socket (default: as lmx-agentd; LMX_SOCKET).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair import" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair list" json' -l 'json' -d 'Print JSON.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair list" db' -l 'db' -d 'The agent\'s database (default: as lmx-agentd; LMX_DB).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair list" socket' -l 'socket' -d 'The agent\'s socket (default: as lmx-agentd; LMX_SOCKET).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair list" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair list" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair remove" db' -l 'db' -d 'The agent\'s database (default: as lmx-agentd; LMX_DB).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair remove" socket' -l 'socket' -d 'The agent\'s socket (default: as lmx-agentd; LMX_SOCKET).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair remove" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair remove" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair export" png' -l 'png' -d 'Write the QR code to this PNG file (created readable by you only).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair export" terminal' -l 'terminal' -d 'Draw the QR code in the terminal.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair export" db' -l 'db' -d 'The agent\'s database (default: as lmx-agentd; LMX_DB).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair export" socket' -l 'socket' -d 'The agent\'s socket (default: as lmx-agentd; LMX_SOCKET).' -rfka ''
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair export" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair export" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-pair' -n '__lmx-pair_should_offer_completions_for_flags_or_options "lmx-pair help" version' -l 'version' -d 'Show the version.'
