function __lmx-status_should_offer_completions_for_flags_or_options -a expected_commands
    set -l non_repeating_flags_or_options $argv[2..]
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-status_parse_tokens
    test "$commands" = "$expected_commands"; and return $non_repeating_flags_or_options_absent
end

function __lmx-status_should_offer_completions_for_positional -a expected_commands positional_index_comparison expected_positional_index
    set -l non_repeating_flags_or_options
    set -l non_repeating_flags_or_options_absent 0
    set -l positional_index 0
    set -l commands
    __lmx-status_parse_tokens
    test "$commands" = "$expected_commands" -a \( "$positional_index" "$positional_index_comparison" "$expected_positional_index" \)
end

function __lmx-status_parse_tokens -S
    set -l unparsed_tokens (__lmx-status_tokens -pc)
    switch $unparsed_tokens[1]
    case 'lmx-status'
        __lmx-status_parse_subcommand 0 'url' 'json' 'watch' 'wait=' 'model=' 'history' 'since=' 'socket=' 'version' 'h/help'
        switch $unparsed_tokens[1]
        case 'help'
            __lmx-status_parse_subcommand -r 1 'version'
        end
    end
end

function __lmx-status_tokens
    if test (string split -m 1 -f 1 -- . "$FISH_VERSION") -gt 3
        commandline --tokens-raw $argv
    else
        commandline -o $argv
    end
end

function __lmx-status_parse_subcommand -S -a positional_count
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

function __lmx-status_complete_directories
    set -l token (commandline -t)
    string match -- '*/' $token
    set -l subdirs $token*/
    printf %s\n $subdirs
end

function __lmx-status_custom_completion
    set -x SAP_SHELL fish
    set -x SAP_SHELL_VERSION $FISH_VERSION
    set -l tokens (__lmx-status_tokens -p)
    if test -z "$(__lmx-status_tokens -t)"
        set -l index (count (__lmx-status_tokens -pc))
        set tokens $tokens[..$index] \'\' $tokens[(math $index + 1)..]
    end
    command $tokens[1] $argv $tokens
end

complete -c 'lmx-status' -f
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" url' -l 'url' -d 'Print only the active base URL (append /v1 for OpenAI clients).'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" json' -l 'json' -d 'Print the full status as JSON (with --watch: the raw NDJSON lines).'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" watch' -l 'watch' -d 'Keep running and print every change.'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" wait' -l 'wait' -d 'Wait until an endpoint is usable, at most this many seconds (30 when given alone), then act as without it.' -rfka ''
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" model' -l 'model' -d 'The best usable endpoint that has this model loaded (with --url: only its URL).' -rfka ''
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" history' -l 'history' -d 'Each route\'s last day as a ribbon of characters (with --json: /v1/history\'s answer).'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" since' -l 'since' -d 'With --history: how far back (1h, 24h, 7d; at most 8d), or an ISO 8601 time.' -rfka ''
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" socket' -l 'socket' -d 'The agent\'s socket.' -rfka ''
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" version' -l 'version' -d 'Show the version.'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status" h help' -s 'h' -l 'help' -d 'Show help information.'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_positional "lmx-status" -eq 1' -fa 'help' -d 'Show subcommand help information.'
complete -c 'lmx-status' -n '__lmx-status_should_offer_completions_for_flags_or_options "lmx-status help" version' -l 'version' -d 'Show the version.'
